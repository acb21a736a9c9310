"""Trajectory files: one JSON per episode (config, messages, per-turn tokens/cache/timings, exit status,
patch), written atomically so a crash or Ctrl-C never leaves a half-written file."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kvagent.agent.loop import EpisodeResult
from kvagent.errors import KvagentError
from kvagent.fileio import atomic_write_json

FORMAT = "kvagent.trajectory/1"
SUFFIX = ".traj.json"


def trajectory_dict(result: EpisodeResult, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`meta` carries what the agent does not know: instance id, model, cache config, seed, ..."""
    body = result.to_dict()
    return {
        "format": FORMAT,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "meta": dict(meta or {}),
        **{k: body[k] for k in ("exit_status", "error", "steps", "prompt_tokens", "logical_length")},
        "elapsed_s": body["elapsed_s"],
        "config": body["config"],
        "patch": body["patch"],  # the graded one
        "graded_patch": body["graded_patch"],  # which of `patches` it is
        "patches": body["patches"],
        "messages": body["messages"],
        "turns": body["turns"],
    }


def _jsonable(value: Any) -> Any:
    # Stats may hold numpy / torch scalars or small tensors.
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def write_json_atomic(path: str | Path, data: Any) -> Path:
    return atomic_write_json(path, data, default=_jsonable)


def write_trajectory(path: str | Path, result: EpisodeResult, meta: Mapping[str, Any] | None = None) -> Path:
    return write_json_atomic(path, trajectory_dict(result, meta))


def load_trajectory(path: str | Path, any_format: bool = False) -> dict[str, Any]:
    """The one reader of trajectory files. `any_format`: any JSON object with a `messages` list
    (other scaffolds' episodes), not only kvagent's own format."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KvagentError(f"trajectory {path} does not exist; check the run directory") from None
    except json.JSONDecodeError as e:
        raise KvagentError(
            f"trajectory {path} is not valid JSON ({e.msg} at line {e.lineno}); rerun the episode"
        ) from None
    if any_format:
        if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
            raise KvagentError(f"{path} has no `messages` list; expected a trajectory JSON")
    elif not isinstance(data, dict) or data.get("format") != FORMAT:
        raise KvagentError(f"{path} is not a kvagent trajectory (expected format {FORMAT!r})")
    return data


def iter_trajectories(
    directory: str | Path, any_format: bool = False
) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every `*.traj.json` under `directory`, sorted by path."""
    directory = Path(directory)
    if not directory.is_dir():
        raise KvagentError(f"{directory} is not a directory of trajectories")
    for path in sorted(directory.rglob(f"*{SUFFIX}")):
        yield path, load_trajectory(path, any_format)
