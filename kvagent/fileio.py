"""Files shared by every layer: atomic writes (a reader, or a crash, never sees half a file), JSONL
appends and the one JSONL reader, and the cache directory."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # Leave no temp file behind, even on Ctrl-C.
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any, default=str) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=1, ensure_ascii=False, default=default) + "\n")


def append_jsonl(path: str | os.PathLike[str], record: Any) -> None:
    """Append one JSON line with a single write + fsync, so a killed writer leaves whole lines."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, Any]]:
    """(line number, record) for each non-blank line of a JSONL file: the one reader of every JSONL
    file. A last line cut short (no newline: its writer was killed mid-write) is skipped; any other
    bad line is a one-line KvagentError."""
    from kvagent.errors import KvagentError

    path = Path(path)
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                if not line.endswith("\n"):  # only the last line can lack one: torn
                    return
                raise KvagentError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None


def cache_dir() -> Path:
    """Where kvagent keeps what it builds once (converted models, rootfs tarballs, sdists):
    $KVAGENT_CACHE, else $XDG_CACHE_HOME/kvagent, else ~/.cache/kvagent."""
    if os.environ.get("KVAGENT_CACHE"):
        return Path(os.environ["KVAGENT_CACHE"])
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "kvagent"
