"""What every command assembles the same way: the engine from its typed options and the output
directories, checked before anything slow starts. (The options' declarations are settings.py's, their
parsing kvagent/options.py's.)"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvagent.cli.settings import EngineOptions
from kvagent.errors import ConfigError


def _dir_problem(target: Path) -> str | None:
    """Why `target` cannot be (made and) written as a directory; None if it can."""
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return (
            f"{target} is a file"
            if existing == target
            else f"{existing} is a file, so {target} cannot be made"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


def check_out_dir(path: str | os.PathLike[str], option: str = "out") -> Path:
    """The directory a command will write to: a file in the way or a place that cannot be written
    fails as one line now, before the model loads, not when the first result is saved. Nothing is
    made here (a run that fails its later checks leaves no empty directory)."""
    target = Path(path).expanduser()
    problem = _dir_problem(target)
    if problem:
        raise ConfigError(f"{option}: {problem}; pass a directory you can write to (made if missing)")
    return target


def check_out_file(path: str | os.PathLike[str], option: str) -> Path:
    """A file a command will write, checked like `check_out_dir` (its directory may be missing)."""
    target = Path(path).expanduser()
    if target.is_dir():
        raise ConfigError(
            f"{option}: {path} is a directory; pass a file name, e.g. {Path(path) / 'out.html'}"
        )
    problem = _dir_problem(target.parent)
    if problem:
        raise ConfigError(f"{option}: cannot write {path}: {problem}; pass a path you can write to")
    return target


@contextlib.contextmanager
def resume_hint(out: str | os.PathLike[str]) -> Iterator[None]:
    """On Ctrl-C in a resumable benchmark: say where its finished runs are and how to go on."""
    try:
        yield
    except KeyboardInterrupt:
        import sys

        print(f"kvagent: finished runs are kept in {out}; rerun the same command to resume", file=sys.stderr)
        raise


def sandbox_workdir(backend: str) -> str:
    """The repository path a sandbox of `backend` shows the model, whose tokens enter the first
    prompt, so checks before the sandbox opens count them: docker's /testbed, or a temp dir named as
    local sandboxes name theirs (made, then removed), which tokenizes like theirs."""
    if backend != "local":
        return "/testbed"
    from kvagent.sandbox import owner

    root = owner.make_dir()
    os.rmdir(root)
    return os.path.join(root, "repo")


def check_engine(engine: EngineOptions) -> None:
    """--device, --decode-step and --linear on this machine (graph needs CUDA, packed a CPU),
    before the model is read."""
    import torch

    from kvagent.runtime import execution

    device = engine.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"device: {device} asked for, but CUDA is not available here; use --device cpu or auto"
        )
    execution.resolve(device, engine.dtype, engine.decode_step, engine.linear)


def load_engine(engine: EngineOptions, max_batch: int = 1) -> Any:
    """The one place a command loads a model, as its engine options say (`max_batch` > 1: concurrent
    sessions share forwards)."""
    import os

    import torch

    from kvagent.runtime import Engine
    from kvagent.runtime.execution import resolve_device

    check_engine(engine)
    if resolve_device(engine.device).type == "cpu":
        # A shared CPU: more threads than cores only adds contention.
        torch.set_num_threads(max(1, min(torch.get_num_threads(), os.cpu_count() or 1)))
    e = engine
    return Engine.load(
        e.model,
        device=e.device,
        dtype=e.dtype,
        max_batch=max_batch,
        decode_step=e.decode_step,
        linear=e.linear,
    )
