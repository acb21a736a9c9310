"""Where replay episodes come from: `load_episodes(specs)` reads each spec (a generated episode, a
trajectory JSON, a JSONL file of another scaffold's messages, a directory of trajectories)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvagent.agent.trajectory import iter_trajectories
from kvagent.bench.episodes import Episode, load_json_episode, load_jsonl_episodes, truncate_messages
from kvagent.bench.generator import generate_episode
from kvagent.bench.manifest import bundled_file
from kvagent.errors import ConfigError


def _parse_opts(text: str, spec: str) -> dict[str, str]:
    opts: dict[str, str] = {}
    for part in filter(None, text.split(",")):
        if "=" not in part:
            raise ConfigError(f"episodes: option {part!r} in {spec!r} is not KEY=VALUE")
        k, v = part.split("=", 1)
        opts[k.strip()] = v.strip()
    return opts


def _int_opt(opts: dict[str, str], key: str, spec: str, default: int | None) -> int | None:
    if key not in opts:
        return default
    try:
        return int(opts.pop(key))
    except ValueError:
        raise ConfigError(f"episodes: {key} in {spec!r} must be an integer") from None


def load_episodes(specs: list[str], open_env: Callable[[Path], Any] | None = None) -> list[Episode]:
    """Each spec is `gen[:seed=N,turns=T,repo=DIR,fact_turn=F,prompt=agent|compact]`, `FILE.jsonl[:first=N,ids=a|b,max_chars=C]`,
    `bundled[:...]` (the built trajectories, bench/manifest.py; options as a .jsonl's),
    `FILE.json[:max_chars=C]` or a directory of `*.traj.json`. `plant=0` leaves external episodes
    without a planted fact (and probe). `open_env(repo)`: the sandbox generated episodes run in."""
    episodes: list[Episode] = []
    for spec in specs:
        spec = spec.strip()
        if not spec:
            continue
        head, _, tail = spec.partition(":")
        opts = _parse_opts(tail, spec)
        plant = opts.pop("plant", "1") not in ("0", "false", "no")
        max_chars = _int_opt(opts, "max_chars", spec, None)
        if head in ("gen", "generated"):
            seed = _int_opt(opts, "seed", spec, 0)
            turns = _int_opt(opts, "turns", spec, 24)
            fact_turn = _int_opt(opts, "fact_turn", spec, 2)
            repo = opts.pop("repo", None)
            prompt = opts.pop("prompt", "agent")
            if opts:
                raise ConfigError(f"episodes: unknown option(s) {', '.join(opts)} in {spec!r}")
            eps = [
                generate_episode(
                    seed=seed, turns=turns, fact_turn=fact_turn, repo=repo, prompt=prompt, open_env=open_env
                )
            ]
        else:
            # `bundled`: the study's 33 trajectories, built by `kvagent bench episodes build`.
            path = bundled_file() if head == "bundled" else Path(head).expanduser()
            if path.is_dir():
                eps = [
                    load_json_episode(p, plant, data) for p, data in iter_trajectories(path, any_format=True)
                ]
                if not eps:
                    raise ConfigError(f"episodes: no *.traj.json under {path}")
            elif path.suffix == ".jsonl":
                first = _int_opt(opts, "first", spec, None)
                ids = set(opts.pop("ids").split("|")) if "ids" in opts else None
                eps = load_jsonl_episodes(path, first=first, ids=ids, plant=plant)
            elif path.suffix == ".json":
                eps = [load_json_episode(path, plant)]
            elif not path.exists():
                raise ConfigError(
                    f"episodes: {spec!r} is neither `gen[:...]` nor an existing file or directory"
                )
            else:
                raise ConfigError(
                    f"episodes: {path} must be a .json trajectory, a .jsonl file or a directory"
                )
            if opts:
                raise ConfigError(f"episodes: unknown option(s) {', '.join(opts)} in {spec!r}")
        if max_chars:
            for e in eps:
                e.messages = truncate_messages(e.messages, max_chars)
        episodes.extend(eps)
    if not episodes:
        raise ConfigError("episodes: no episode given; use e.g. --episodes gen:seed=0")
    return episodes
