"""`kvagent solve`: load a model, open a sandbox, run one episode, keep its outputs."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console

from kvagent.agent.loop import EpisodeInterrupted
from kvagent.cli.common import check_out_dir, load_engine, sandbox_workdir
from kvagent.cli.settings import AgentOptions, CacheOptions, EngineOptions, agent_config_of, cache_config_of
from kvagent.errors import ConfigError, KvagentError
from kvagent.fileio import atomic_write_text


def read_issue(issue: str) -> str:
    """--issue takes the text itself or a path to a file holding it."""
    if not issue.strip():
        raise KvagentError("issue: empty; pass the issue text or a file holding it")
    path = Path(issue).expanduser()
    looks_like_path = (
        "\n" not in issue and " " not in issue.strip() and (bool(path.suffix) or os.sep in issue)
    )
    if looks_like_path:
        if not path.is_file():
            raise KvagentError(f"issue: file {issue} does not exist; pass the issue text or an existing file")
        return path.read_text(encoding="utf-8", errors="replace")
    return issue


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


def check_image(spec: dict[str, Any]) -> None:
    """A missing image fails here, before the (slow) model load, not when the sandbox opens."""
    if spec["backend"] != "docker":
        return
    from kvagent.sandbox.images import image_exists

    if not image_exists(spec["image"]):
        raise KvagentError(
            f"image: docker image {spec['image']!r} not found locally; build it with `kvagent images build "
            "--instances ID` (or `docker load` it), or pass --repo PATH"
        )


def check_before_sandbox(
    engine: Any, cache_config: Any, agent_config: Any, issue_text: str = "", workdir: str = "/testbed"
) -> None:
    """Fail on a bad budget for this model, on a first prompt that reaches --context-limit, and on a
    protected prompt the budget cannot hold (`check_run`), before a sandbox is opened. The first
    prompt is counted as `kvagent eval` counts it (`first_prompt_tokens`), in a sandbox whose
    repository is at `workdir`."""
    from kvagent.agent.solve import first_prompt_tokens
    from kvagent.runtime.budget import check_run

    check_run(engine, cache_config)
    length = first_prompt_tokens(engine.tokenizer, issue_text, agent_config, workdir)
    problem = check_run(engine, cache_config, length, context_limit=agent_config.context_limit)
    if problem:
        raise ConfigError(problem)


def run_solve(
    *,
    issue: str,
    repo: str | None,
    image: str | None,
    engine: EngineOptions,
    cache: CacheOptions | Mapping[str, Any],
    agent: AgentOptions | Mapping[str, Any],
    out: str | None = None,
    console: Console | None = None,
    isolation: str = "bwrap",
    network: str | None = None,  # None: the scaffold's
) -> Any:
    from kvagent.agent.solve import solve_episode
    from kvagent.cli import environments
    from kvagent.cli.ui import EpisodeStream
    from kvagent.sandbox import open_sandbox

    issue_text = read_issue(issue)
    cfg, agent_cfg = cache_config_of(cache), agent_config_of(agent)
    console = console or Console(stderr=True)
    spec = environments.with_network(
        environments.with_isolation(sandbox_spec(repo, image), isolation), network, agent_cfg.scaffold
    )
    check_image(spec)
    out_dir = check_out_dir(out or f"runs/solve-{time.strftime('%Y%m%d-%H%M%S')}")
    console.print(f"loading model {engine.model} ...")
    engine = load_engine(engine)
    check_before_sandbox(engine, cfg, agent_cfg, issue_text, sandbox_workdir(spec["backend"]))
    out_dir.mkdir(parents=True, exist_ok=True)
    trajectory = out_dir / "episode.traj.json"
    stream = EpisodeStream(console, agent_cfg.max_steps)
    try:
        with open_sandbox(**spec) as sandbox:
            result = solve_episode(
                stream.wrap(engine),
                sandbox,
                issue_text,
                cache_config=cfg,
                config=agent_cfg,
                trajectory_path=trajectory,
                meta={"sandbox": spec},
                on_event=stream,
            )
    except EpisodeInterrupted as stop:
        atomic_write_text(out_dir / "patch.diff", stop.result.patch)
        console.print(f"interrupted after {stop.result.steps} steps; partial trajectory: {trajectory}, "
                      f"patch so far: {out_dir / 'patch.diff'}", soft_wrap=True)  # fmt: skip
        raise
    atomic_write_text(out_dir / "patch.diff", result.patch)
    print(result.patch, end="" if result.patch.endswith("\n") or not result.patch else "\n")
    console.print(
        f"exit status: {result.exit_status} after {result.steps} steps, {result.logical_length:,} tokens; "
        f"trajectory: {trajectory}; patch: {out_dir / 'patch.diff'}",
        soft_wrap=True,  # whole paths, to copy
    )
    if result.exit_status == "error":
        raise KvagentError(f"episode failed: {result.error}; partial trajectory kept at {trajectory}")
    return result
