"""`kvagent solve`: load a model, open a sandbox, run one episode, keep its outputs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console

from kvagent.agent.config import AgentConfig
from kvagent.agent.solve import check_prompt_fits, solve_episode
from kvagent.errors import KvagentError
from kvagent.fileio import atomic_write_text


def sandbox_spec(repo: str | None, image: str | None) -> dict[str, Any]:
    """Validate --repo / --image before anything slow happens."""
    if (repo is None) == (image is None):
        raise KvagentError("solve: pass exactly one of --repo PATH or --image NAME")
    if repo is not None:
        path = Path(repo).expanduser()
        if not path.is_dir():
            raise KvagentError(f"repo: {repo} is not a directory; pass the path of a repository checkout")
        return {"backend": "local", "repo": str(path.resolve())}
    return {"backend": "docker", "image": image}


def run_solve(
    *,
    issue_text: str,
    repo: str | None,
    image: str | None,
    model: str,
    cache_config: Any,
    agent_config: AgentConfig,
    out: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    console: Console | None = None,
) -> Any:
    from kvagent.runtime import Engine
    from kvagent.sandbox import open_sandbox
    from kvagent.ui import EpisodeProgress

    console = console or Console(stderr=True)
    spec = sandbox_spec(repo, image)
    out_dir = Path(out or f"runs/solve-{time.strftime('%Y%m%d-%H%M%S')}")
    console.print(f"loading model {model} ...")
    engine = Engine.load(model, device=device, dtype=dtype)
    engine.session(cache_config)  # fail on a bad budget for this model before opening a sandbox
    check_prompt_fits(engine.tokenizer, cache_config, agent_config.prompt_style, issue_text)
    out_dir.mkdir(parents=True, exist_ok=True)
    trajectory = out_dir / "episode.traj.json"
    progress = EpisodeProgress(console, cache_config.budget, cache_config.buffer, agent_config.max_steps)
    with open_sandbox(**spec) as sandbox, progress:
        result = solve_episode(
            engine,
            sandbox,
            issue_text,
            cache_config=cache_config,
            config=agent_config,
            trajectory_path=trajectory,
            meta={"sandbox": spec},
            on_event=progress,
        )
    console.print()  # end the live status line
    atomic_write_text(out_dir / "patch.diff", result.patch)
    print(result.patch, end="" if result.patch.endswith("\n") or not result.patch else "\n")
    console.print(
        f"exit status: {result.exit_status} after {result.steps} steps, {result.logical_length:,} tokens; "
        f"trajectory: {trajectory}; patch: {out_dir / 'patch.diff'}"
    )
    if result.exit_status == "error":
        raise KvagentError(f"episode failed: {result.error}; partial trajectory kept at {trajectory}")
    return result
