"""Full-cache references kept on disk beside a fidelity run: a long run (the study) restarts many
times, and replaying every episode's reference again at each restart costs as much as a policy run
(each is one full replay). A reference is a pure function of the model, its device and dtype and the
token stream, so the file name is those (plus the top-k kept); a changed stream gets a new file."""

from __future__ import annotations

import dataclasses
import io
import re
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


def cached_reference(
    engine, stream: Stream, out_dir: Path, model_name: str, progress=None
) -> rp.ReplayResult:
    """The stream's full-cache run from `out_dir/references`, replayed (and written) if absent."""
    path = reference_path(out_dir, engine, stream, model_name)
    if path.exists():
        res = _load(path)
        if res is not None:
            return res
    res = rp.reference_run(engine, stream, progress=progress)
    atomic_write_bytes(path, _dump(res))
    return res
