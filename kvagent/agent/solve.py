"""One episode from an engine and an environment (what `kvagent solve` and the eval runner run)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kvagent.agent.config import AgentConfig
from kvagent.agent.interfaces import Engine, Environment
from kvagent.agent.loop import AgentEvent, EpisodeResult, run_episode
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
    result = run_episode(session, env, issue_text, config, tokenizer=engine.tokenizer, on_event=on_event)
    if trajectory_path is not None:
        info: dict[str, Any] = {"cache_config": _as_dict(cache_config)}
        name = getattr(engine, "name", None) or getattr(getattr(engine, "model", None), "name_or_path", None)
        if name:
            info["model"] = str(name)
        info.update(meta or {})
        write_trajectory(trajectory_path, result, info)
    return result


def _as_dict(obj: Any) -> Any:
    return obj.to_dict() if hasattr(obj, "to_dict") else obj


def first_prompt_length(tokenizer: Any, issue_text: str, prompt_style: str) -> int:
    """Tokens of an episode's first prompt (system + instance prompt, before any step notice): what
    protect=prompt keeps, for checking a budget before a sandbox is opened."""
    from kvagent.agent.prompts import instance_prompt, system_prompt
    from kvagent.agent.render import ChatMLRenderer

    return len(
        ChatMLRenderer(tokenizer).prompt_ids(system_prompt(), instance_prompt(issue_text, prompt_style))
    )
