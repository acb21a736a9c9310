"""Files shared by every layer: atomic writes (a reader, or a crash, never sees half a file), JSONL
appends and the one JSONL reader, and the cache directory."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _umask() -> int:
    """The process umask, read without setting it where Linux shows it (setting is racy in threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, mode: int | None = None) -> Path:
    """Write through a temp file renamed into place. The file gets `mode`, by default what a plain
    open() would give (0o666 less the umask), not mkstemp's private 0o600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask() if mode is None else mode)
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
    """Append one JSON line with a single write + fsync, so a killed writer leaves whole lines. The one
    writer of every results file: under an exclusive lock (threads and processes may share a file), it
    first heals a torn tail (a last line cut short by power loss or a full disk), so a new record is
    never glued onto a fragment; every whole record is kept."""
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _heal_tail(fd)
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)  # releases the lock


def _heal_tail(fd: int) -> None:
    """Make the file end at a line boundary: a last line that lacks its newline gets one if it is a
    whole JSON value, and is cut off otherwise (it was never a whole record)."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    start, tail = size, b""
    while start > 0:
        lo = max(0, start - (1 << 16))
        chunk = os.pread(fd, start - lo, lo)
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            tail, start = chunk[cut + 1 :] + tail, lo + cut + 1
            break
        tail, start = chunk + tail, lo
    try:
        json.loads(tail.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        os.ftruncate(fd, start)
    else:
        os.write(fd, b"\n")
    os.fsync(fd)


def read_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, Any]]:
    """(line number, record) for each non-blank line of a JSONL file: the one reader of every JSONL
    file. A last line cut short (no newline: its writer was killed mid-write) is skipped; any other
    bad line is a one-line KvagentError."""
    from kvagent.errors import KvagentError

    path = Path(path)
    # errors="replace": a line torn inside a multi-byte character is skipped below, not a traceback.
    with path.open(encoding="utf-8", errors="replace") as f:
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
