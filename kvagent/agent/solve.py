"""One episode from an engine and an environment (what `kvagent solve` and the eval runner run)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvagent.agent.config import AgentConfig
from kvagent.agent.interfaces import Engine, Environment
from kvagent.agent.loop import Agent, AgentEvent, EpisodeInterrupted, EpisodeResult, run_episode
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


class _PromptProbe:
    """A session that only keeps what the agent feeds it first: the episode's rendered prompt."""

    logical_length = 0
    stats = None

    def __init__(self) -> None:
        self.ids: list[int] = []

    def append(self, ids: Sequence[int]) -> None:
        self.ids = list(ids)


@dataclass
class _Workdir:
    workdir: str


def first_prompt_tokens(
    tokenizer: Any, issue_text: str, config: AgentConfig, workdir: str = "/testbed"
) -> int:
    """Tokens of an episode's first prompt, rendered by the agent itself as it starts an episode in an
    environment whose repository is at `workdir` (system prompt, instance prompt naming that path, step
    notice): what protect=prompt keeps and the context limit must exceed. The one count solve, chat and
    eval check a budget with before a sandbox opens."""
    probe = _PromptProbe()
    # No context limit here: the caller compares the length with it and says by how much it misses.
    Agent(probe, _Workdir(workdir), tokenizer, replace(config, context_limit=1 << 62)).start(issue_text)
    return len(probe.ids)
