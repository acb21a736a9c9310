"""Full-cache references kept on disk beside a fidelity run: a long run (the study) restarts many
times, and replaying every episode's reference again at each restart costs as much as a policy run
(each is one full replay). A reference is a pure function of the model, its device and dtype and the
token stream, so the file name is those (plus the top-k kept); a changed stream gets a new file.
Several processes on one out dir (fidelity/shared_results.py) share the references too: each is
replayed by whichever process locks it first, the others take free ones and then wait for the held
ones' files; a holder that dies releases its lock, and the waiter replays."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import io
import re
from collections.abc import Iterable
from pathlib import Path

import torch

from kvagent.bench import replay as rp
from kvagent.bench.stream import Stream
from kvagent.fileio import atomic_write_bytes

REFERENCES = "references"  # directory under a fidelity run's out dir
FORMAT = 1  # bumped when what a reference holds changes: older files are then replayed again


def reference_path(out_dir: Path, engine, stream: Stream, model_name: str) -> Path:
    dtype = str(engine.dtype).removeprefix("torch.")
    device = getattr(engine.device, "type", str(engine.device))  # CUDA kernels round differently
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_name)
    return Path(out_dir) / REFERENCES / f"{safe}-{device}-{dtype}-top{rp.TOPK}-{stream.digest()}.pt"


def _dump(res: rp.ReplayResult) -> bytes:
    state = {f.name: getattr(res, f.name) for f in dataclasses.fields(res) if f.name != "reference"}
    state["reference"] = dataclasses.asdict(res.reference)
    buf = io.BytesIO()
    torch.save({"format": FORMAT, "result": state}, buf)
    return buf.getvalue()


def _load(path: Path) -> rp.ReplayResult | None:
    try:
        blob = torch.load(path, weights_only=True)
    except Exception:  # a torn or foreign file: replay the reference again
        return None
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        return None
    state = dict(blob["result"])
    state["reference"] = rp.Reference(**state["reference"])
    state["memory"] = [tuple(m) for m in state.get("memory", [])]
    return rp.ReplayResult(**state)


@contextlib.contextmanager
def _replaying(path: Path, wait: bool):
    """True while this process holds the right to replay `path`'s reference (False: another holds
    it and `wait` is off). flock: released by the kernel when its holder dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _stored(path: Path) -> rp.ReplayResult | None:
    return _load(path) if path.exists() else None


def _replay(engine, stream: Stream, path: Path, progress) -> rp.ReplayResult:
    res = rp.reference_run(engine, stream, progress=progress)
    atomic_write_bytes(path, _dump(res))
    return res


def cached_reference(
    engine, stream: Stream, out_dir: Path, model_name: str, progress=None, wait: bool = True
) -> rp.ReplayResult | None:
    """The stream's full-cache run from `out_dir/references`, replayed (and written) if absent, or
    waited for if another process is replaying it (`wait` off: None then). `progress`: the
    replay's advance callback."""
    path = reference_path(out_dir, engine, stream, model_name)
    res = _stored(path)
    if res is None:
        with _replaying(path, wait) as mine:  # after a wait: stored, unless its holder died
            res = (_stored(path) or _replay(engine, stream, path, progress)) if mine else None
    return res


def fill_references(
    engine, streams: Iterable[Stream], out_dir: Path, model_name: str, refs: dict, progress, size
) -> None:
    """Put each stream's reference in `refs` (by digest): the stored ones and those no other process
    is replaying, then, waiting, those one is. `progress.task` gets a bar per replay; `size(stream)`
    is its total."""
    held = []
    for stream in [st for st in dict.fromkeys(streams) if st.digest() not in refs]:
        path = reference_path(out_dir, engine, stream, model_name)
        res = _stored(path)
        if res is None:
            with _replaying(path, wait=False) as mine:
                res = _stored(path) if mine else None
                if mine and res is None:
                    bar = progress.task(f"{stream.name} reference", size(stream))
                    res = _replay(engine, stream, path, bar.advance)
                    bar.done()
        if res is None:
            held.append(stream)
        else:
            refs[stream.digest()] = res
    for stream in held:  # another process's replays: their files once they are written
        refs[stream.digest()] = cached_reference(engine, stream, out_dir, model_name)
