"""Save and restore a session exactly: the state a later call reads, moved to host memory or a file.

Under persistent eviction a session's cache is a function of everything it was ever fed, so it
cannot be rebuilt from its history (that is reprefill's protocol). This module captures all that
decides what the session does next and puts it back into a fresh session of the same engine:
the cache (`EvictableCache.export_state`: per layer the kept keys, values and positions, per KV
head for adaptive layers, the window and pending queries), the evictor's per-layer policy state
(H2O's accumulated attention), round counter and audit, the token history, prompt length, last
logits, the reprefill `_stale` flag, the sampling generator's state, the CacheConfig and the stats.
Round generators are seeded from (seed, layer, logical length) and hold no state; a `reuse_prefix`
snapshot is a speed-up for replays only and is not saved (the next rebuild starts from 0, with the
same result).

A file is safetensors whose `__metadata__["kvagent"]` is a JSON header: format and version, the
model's identity (name, layers, KV heads, head dim, vocab, dtype and a fingerprint of its weights),
the session's non-tensor state and a checksum of that state and every tensor (`digest`). `read`
checks the header, the file's length and every cache tensor's shape before anything is allocated,
then the checksum before the state is used, and refuses another model's file, another version's, a
truncated one or one whose bytes changed after it was written with one line (ConfigError)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvagent.errors import ConfigError
from kvagent.fileio import atomic_write_bytes
from kvagent.runtime.audit import AuditRound
from kvagent.runtime.config import CacheConfig
from kvagent.runtime.marks import SegmentMarks

FORMAT = "kvagent-session"
VERSION = 2  # 2: the header holds a checksum of the state and tensors
MAX_HEADER = 256 * 2**20  # a JSON header past this is no session file (tensors and token ids are not in it)
_CPU = ("history", "sample_gen", "audit.")  # tensors that live on the host whatever the engine's device


@dataclass
class SessionState:
    """One session's state off its engine: tensors (on the host after `to_host`) and JSON meta."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def to_host(self, pin: bool = False) -> SessionState:
        """The tensors copied to host memory; `pin` (CUDA): into pinned buffers on a side stream, so
        the copy overlaps other sessions' forwards instead of stalling them."""
        if not pin or not torch.cuda.is_available():
            return SessionState({k: t.detach().to("cpu") for k, t in self.tensors.items()}, self.meta)
        main, side = torch.cuda.current_stream(), torch.cuda.Stream()
        side.wait_stream(main)  # after the writes that made them
        out = {}
        with torch.cuda.stream(side):
            for k, t in self.tensors.items():
                if t.device.type == "cpu":
                    out[k] = t
                    continue
                out[k] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
        side.synchronize()  # this thread only: other streams' work goes on
        return SessionState(out, self.meta)


# ----------------------------------------------------------------- the model a state belongs to
def model_identity(engine) -> dict[str, Any]:
    """What a state's tensors must match: shapes, dtype, and the weights that made them."""
    model = engine.model
    h = hashlib.sha256()
    params = list(model.parameters())
    for p in (params[0], params[len(params) // 2], params[-1]):
        h.update(p.detach().flatten()[:4096].to("cpu", torch.float32).numpy().tobytes())
    h.update(str(sum(p.numel() for p in params)).encode())
    return {
        "name": engine.name,
        "layers": engine.n_layers,
        "kv_heads": engine.n_kv_heads,
        "head_dim": engine.head_dim,
        "vocab": int(model.config.vocab_size),
        "dtype": str(engine.dtype).removeprefix("torch."),
        "fingerprint": h.hexdigest()[:16],
    }


def check_identity(saved: dict[str, Any], engine, where: str) -> None:
    here = model_identity(engine)
    for key in ("layers", "kv_heads", "head_dim", "vocab", "dtype", "fingerprint"):
        if saved.get(key) != here[key]:
            raise ConfigError(
                f"{where}: saved from model {saved.get('name')!r} ({key} {saved.get(key)}), but this engine runs "
                f"{here['name']!r} ({key} {here[key]}); load it with the model and dtype that saved it"
            )


# ----------------------------------------------------------------- session <-> state
def export_session(session) -> SessionState:
    """The session's whole state, tensors still on its device (`to_host` moves them)."""
    ev = session.evictor
    cache_tensors, cache_meta = ev.cache.export_state()
    tensors = {f"cache.{k}": t for k, t in cache_tensors.items()}
    tensors["history"] = torch.tensor(session.history, dtype=torch.long)
    state = [_flatten(st, f"state.{li}", tensors) for li, st in enumerate(ev.state)]
    audit = None
    if ev.audit is not None:
        audit = []
        for i, r in enumerate(ev.audit):
            tensors[f"audit.{i}"] = r.kept.detach().to("cpu").contiguous().clone()
            audit.append({f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "kept"})
    if session._last_logits is not None:
        tensors["last_logits"] = session._last_logits.detach().contiguous().clone()
    if session._sample_gen is not None:
        tensors["sample_gen"] = session._sample_gen.get_state()
    meta = {
        "config": session.config.to_dict(),
        "prompt_length": session.prompt_length,
        "stale": session._stale,
        "round_index": ev.round_index,
        "segments": list(ev.segments),  # Session.mark_segment's marks (the segments policy scores by them)
        "stats": dataclasses.asdict(session._stats),
        "cache": cache_meta,
        "state": state,
        "audit": audit,
    }
    return SessionState(tensors, meta)


def import_session(engine, state: SessionState, where: str = "session state"):
    """A new session of `engine` continuing exactly where the exported one was (`where` names the
    state in errors)."""
    m = state.meta
    try:
        config = CacheConfig(**m["config"])
    except TypeError as e:
        raise ConfigError(
            f"{where}: its cache config does not fit this kvagent ({e}); start a new session"
        ) from None
    session = engine.session(config)
    ev, dev = session.evictor, engine.device
    t = {k: _place(k, v, dev) for k, v in state.tensors.items()}
    _check_capacities(ev.cache, m["cache"], ev.schedule, where)
    if m["cache"]["slot"] and ev.slot is not None and ev.cache.slot is None:
        ev.cache.attach_slot(ev.slot)  # a reprefill cache compressed into its slot
    ev.cache.import_state({k[len("cache.") :]: v for k, v in t.items() if k.startswith("cache.")}, m["cache"])
    ev.state = [_unflatten(spec, t) for spec in m["state"]]
    ev.round_index = m["round_index"]
    ev.segments = SegmentMarks(m.get("segments", []))
    if m["audit"] is not None:
        ev.audit = [AuditRound(**a, kept=t[f"audit.{i}"]) for i, a in enumerate(m["audit"])]
    session.history = t["history"].tolist()
    session.prompt_length = m["prompt_length"]
    session._stale = m["stale"]
    session._last_logits = t.get("last_logits")
    if "sample_gen" in t:
        session._sample_gen = torch.Generator()
        session._sample_gen.set_state(t["sample_gen"])
    for k, v in m["stats"].items():  # in place: the evictor counts into the same object
        setattr(session._stats, k, v)
    return session


def _place(name: str, t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A state tensor where the session keeps it; a copy, so a state imported twice (or kept) never
    shares a tensor a session changes in place (H2O's accumulator). The layers' keys and values
    are copied into their buffers by `import_state` anyway."""
    if name.startswith("cache.layers."):
        return t.to(device)
    return t.to("cpu" if name.startswith(_CPU) else device, copy=True)


def _flatten(obj: Any, name: str, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Policy state as a JSON spec; its tensors go to `tensors` under dotted names."""
    if isinstance(obj, torch.Tensor):
        tensors[name] = obj.detach().contiguous().clone()
        return {"tensor": name}
    if isinstance(obj, dict) and all(isinstance(k, str) for k in obj):
        return {"dict": {k: _flatten(v, f"{name}.{k}", tensors) for k, v in obj.items()}}
    if isinstance(obj, list | tuple):
        return {"list": [_flatten(v, f"{name}.{i}", tensors) for i, v in enumerate(obj)]}
    if obj is None or isinstance(obj, bool | int | float | str):
        return {"value": obj}
    raise ConfigError(f"save: policy state {name} is a {type(obj).__name__}, which cannot be saved")


def _unflatten(spec: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Any:
    if "tensor" in spec:
        return tensors[spec["tensor"]]
    if "dict" in spec:
        return {k: _unflatten(v, tensors) for k, v in spec["dict"].items()}
    if "list" in spec:
        return [_unflatten(v, tensors) for v in spec["list"]]
    return spec["value"]


def _check_capacities(cache, cache_meta: dict, schedule, where: str) -> None:
    """Refuse buffer sizes no session of this config reaches (its `Schedule`), before they are
    allocated."""
    config = schedule.config
    for li, (layer, m) in enumerate(zip(cache.layers, cache_meta["layers"], strict=True)):
        if not m["init"]:
            continue
        sizes = zip(m["counts"], m["capacities"], strict=True) if "counts" in m else [(m["n"], m["capacity"])]
        for n, cap in sizes:
            top = max(2 * n, schedule.trigger(n), 16, config.prefill_chunk, layer.capacity_hint)
            if not 0 <= n <= cap <= top:
                raise ConfigError(
                    f"{where}: layer {li} claims {n} entries in a buffer of {cap}; the file is damaged"
                )


# ----------------------------------------------------------------- files
def save(session, path: str | os.PathLike[str]) -> int:
    """Write the session to `path` atomically; returns the bytes written."""
    return write(export_session(session).to_host(), session.engine, path)


def write(state: SessionState, engine, path: str | os.PathLike[str]) -> int:
    """Write an exported state of one of `engine`'s sessions to `path` atomically; returns the bytes."""
    from safetensors.torch import save as to_bytes

    tensors = {k: t.to("cpu").contiguous() for k, t in state.tensors.items()}
    header = {"format": FORMAT, "version": VERSION, "model": model_identity(engine), "state": state.meta,
              "checksum": digest(tensors, state.meta)}  # fmt: skip
    data = to_bytes(tensors, metadata={"kvagent": json.dumps(header)})
    atomic_write_bytes(path, data)
    return len(data)


def digest(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> str:
    """A checksum of a state: its JSON meta and every tensor's name, dtype, shape and bytes, so a
    flipped byte anywhere in a file's data is seen before the session is used."""
    h = hashlib.sha256(json.dumps(meta, sort_keys=True).encode())
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(f"\0{name}\0{t.dtype}\0{list(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return f"sha256:{h.hexdigest()}"


def inspect(path: str | os.PathLike[str], engine=None) -> tuple[dict, dict]:
    """A session file's safetensors entries and kvagent header, read without its data: refused
    (ConfigError, one line) if it is no session file, another version's, cut short or, given
    `engine`, another model's or of shapes this model has none of."""
    path = Path(path)
    where = f"session file {path}"
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little") if size >= 8 else -1
            raw = f.read(n) if 0 <= n <= min(MAX_HEADER, size - 8) else b""
    except FileNotFoundError:
        raise ConfigError(f"{where}: not found; check the path, or start a new session") from None
    try:
        entries = json.loads(raw) if raw else None
        header = json.loads(entries["__metadata__"]["kvagent"])
    except (ValueError, KeyError, TypeError):
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ConfigError(
            f"{where}: not a kvagent session file (or cut short); pass a file Session.save wrote"
        )
    if header.get("version") != VERSION:
        raise ConfigError(
            f"{where}: format version {header.get('version')}, this kvagent reads version {VERSION}; "
            "open it with the kvagent that saved it, or start a new session"
        )
    try:
        end = max((e["data_offsets"][1] for k, e in entries.items() if k != "__metadata__"), default=0)
    except (KeyError, TypeError, IndexError):
        end = -1
    if size != 8 + n + end:
        raise ConfigError(
            f"{where}: {size} bytes where its header says {8 + n + end}; it was cut short, save it again"
        )
    if engine is not None:
        check_identity(header.get("model") or {}, engine, where)
        _check_shapes(entries, header["model"], where)
    return entries, header


def read(path: str | os.PathLike[str], engine=None) -> SessionState:
    """A session file's state, checked against `engine` (header, length, shapes) before loading
    and against its checksum before it is used (`engine` None: every check but the model's)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    _, header = inspect(path, engine)
    where = f"session file {path}"
    try:
        tensors = load_file(str(path))
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise ConfigError(f"{where}: its tensors cannot be read ({e}); the file is damaged") from None
    if header.get("checksum") != digest(tensors, header["state"]):
        raise ConfigError(
            f"{where}: its data does not match the checksum it was saved with (damaged after it was "
            "written); start a new session"
        )
    return SessionState(tensors, header["state"])


def peek(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[int]]:
    """A session file's state meta and token history, without loading the rest (unchecked by the
    checksum: for naming a conversation whose other records are gone, never for continuing it)."""
    from safetensors import SafetensorError, safe_open

    _, header = inspect(path)
    try:
        with safe_open(str(path), "pt") as f:
            history = f.get_tensor("history").tolist()
    except (SafetensorError, ValueError, RuntimeError, KeyError) as e:
        raise ConfigError(
            f"session file {path}: its history cannot be read ({e}); the file is damaged"
        ) from None
    return header["state"], history


def _check_shapes(entries: dict, model: dict[str, Any], where: str) -> None:
    h, d = model["kv_heads"], model["head_dim"]
    for name, e in entries.items():
        if not name.startswith("cache.layers."):
            continue
        shape = e["shape"]
        head = ".head" in name
        want_h = shape[:0] if head else [1, h]
        ok = shape[: len(want_h)] == want_h and (name.endswith("positions") or shape[-1] == d)
        if not ok:
            raise ConfigError(
                f"{where}: {name} has shape {shape}, not one of this model's; the file is damaged"
            )


def load(path: str | os.PathLike[str], engine):
    """`engine`'s new session continuing the one saved at `path`."""
    return import_session(engine, read(path, engine), f"session file {path}")
