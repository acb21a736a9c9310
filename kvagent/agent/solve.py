"""One episode from an engine and an environment (what `kvagent solve` and the eval runner run)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kvagent.agent.config import AgentConfig
from kvagent.agent.interfaces import Engine, Environment
from kvagent.agent.loop import AgentEvent, EpisodeInterrupted, EpisodeResult, run_episode
from kvagent.agent.trajectory import write_trajectory


def solve_episode(
    engine: Engine,
    env: Environment,
    issue_text: str,
    *,
    cache_config: Any = None,
    config: AgentConfig | None = None,
    trajectory_path: str | Path | None = None,
    meta: Mapping[str, Any] | None = None,
    on_event: Callable[[AgentEvent], None] | None = None,
) -> EpisodeResult:
    """Open a fresh session on `engine` with `cache_config` (default: `CacheConfig()`), run the agent in
    `env` on `issue_text`, and write the trajectory to `trajectory_path` if given."""
    if cache_config is None:
        from kvagent.runtime.config import CacheConfig

        cache_config = CacheConfig()
    session = engine.session(cache_config)
    try:
        result = run_episode(session, env, issue_text, config, tokenizer=engine.tokenizer, on_event=on_event)
    except EpisodeInterrupted as stop:  # Ctrl-C: keep the partial trajectory, then stop
        _keep(trajectory_path, stop.result, engine, cache_config, meta)
        raise
    _keep(trajectory_path, result, engine, cache_config, meta)
    return result


def _keep(path: str | Path | None, result: EpisodeResult, engine: Any, cache_config: Any, meta: Any) -> None:
    if path is None:
        return
    info: dict[str, Any] = {"cache_config": _as_dict(cache_config)}
    name = getattr(engine, "name", None) or getattr(getattr(engine, "model", None), "name_or_path", None)
    if name:
        info["model"] = str(name)
    info.update(meta or {})
    write_trajectory(path, result, info)


def _as_dict(obj: Any) -> Any:
    return obj.to_dict() if hasattr(obj, "to_dict") else obj


def first_prompt_length(tokenizer: Any, issue_text: str, prompt_style: str | AgentConfig) -> int:
    """Tokens of an episode's first prompt (system + instance prompt, before any step notice): what
    protect=prompt keeps, for checking a budget before a sandbox is opened. Pass the AgentConfig to
    count its profile's prompts (a --prompts file); a style name counts kvagent's own."""
    from kvagent.agent.render import ChatMLRenderer
    from kvagent.agent.scaffold import make_scaffold

    config = prompt_style if isinstance(prompt_style, AgentConfig) else AgentConfig(prompt_style=prompt_style)
    scaffold = make_scaffold(config)
    instance = scaffold.instance(issue_text, config.repo_dir or "/testbed")
    return len(ChatMLRenderer(tokenizer).prompt_ids(scaffold.system(), instance))
