"""Where idle sessions go instead of being dropped: host memory (`--swap-space`), then disk
(`--session-dir`), least recently used first; and where a stopping server leaves its sessions for
the next one (`--session-dir`).

A session moves out whole and exactly (`runtime.persist`: its evicted cache, policy state, stream,
generator), so a conversation that comes back continues as if it had never left; re-prefilling
its history would instead change the experiment's protocol (a dense prefill and one round). Host
memory holds the most recently moved-out sessions: when it is full, its oldest go to disk, or are
dropped (counted) where there is no disk. A session on disk is a `<id>.kvs` file (persist's format)
and a `<id>.json` beside it: what matching a request needs without loading the file (its config,
first append and token history), written before the session, so a server killed between the two
leaves a conversation without a session (lost), never a session beside another one's history.

A session comes back only if its file reads back whole (persist: header, length, checksum) and
holds the very token history its conversation was matched by; otherwise its files are moved to
`DIR/unreadable/` (one log line) and its conversation is counted dropped, `unreadable`. Ids are
numbered past every session file in the directory (moved-aside ones included), so a new
conversation never takes an id some file still carries."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
from array import array
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvagent.errors import ConfigError
from kvagent.fileio import atomic_write_json
from kvagent.runtime import CacheConfig, persist

KEEP_LOST = 256  # markers of lost conversations kept (as many as dropped ones are remembered)
UNREADABLE = "unreadable"  # the subdirectory files that cannot be read back are moved to
SID = re.compile(r"s(\d+)")  # a session id: s<number>
log = logging.getLogger("kvagent.serve")


@dataclass(eq=False)
class Stored:
    """A conversation whose session is out of memory: on the host (`state`) or on disk (`path`)."""

    id: str
    config: CacheConfig
    first: int
    history: array
    reply_start: int
    requests: int
    nbytes: int
    state: persist.SessionState | None = None
    path: Path | None = None

    @property
    def where(self) -> str:
        return "host" if self.state is not None else "disk"


class Offload:
    """Not thread-safe: the caller (Conversations) holds its lock around index changes; the copies
    themselves run outside it, on a conversation nobody else can lease while it moves."""

    def __init__(self, engine: Any, swap_bytes: int = 0, session_dir: str | os.PathLike[str] | None = None):
        self.engine = engine
        self.swap_bytes = swap_bytes
        self.dir = Path(session_dir) if session_dir is not None else None
        self._lock = threading.Lock()  # the index: requests read it while a move writes it
        self.host: OrderedDict[str, Stored] = OrderedDict()  # oldest first
        self.spilling: dict[str, Stored] = {}  # host sessions being written to disk
        self.disk: dict[str, Stored] = {}
        self.outs, self.ins = Counter(), Counter()  # by where: "host" | "disk"
        self.bytes = Counter()  # "out" | "in"
        self.seconds = Counter()
        self.lost: list[Stored] = []  # conversations a killed server had in memory (their markers)
        self.unreadable: list[Stored] = []  # conversations whose saved session was found unreadable at start
        self.set_aside_before: list[Stored] = []  # those set aside by an earlier server (not counted again)
        self.last_id = 0  # the highest session number any file in the directory carries
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._scan()

    @property
    def host_bytes(self) -> int:
        return sum(s.nbytes for s in self.host.values())

    def stored(self) -> list[Stored]:
        with self._lock:
            return [*self.host.values(), *self.spilling.values(), *self.disk.values()]

    def claim(self, stored: Stored) -> None:
        """Take `stored` out of the index (its conversation is coming back)."""
        with self._lock:
            for index in (self.host, self.spilling, self.disk):
                index.pop(stored.id, None)

    # ----------------------------------------------------------------- out
    def move_out(self, conv: Any) -> tuple[Stored | None, list[Stored]]:
        """Export `conv`'s session; to the host if it fits there (spilling the oldest host sessions
        to disk, or dropping them without one), else to disk. Returns the stored entry (None: no
        room anywhere, the session is dropped) and the host sessions dropped for room."""
        t0 = time.perf_counter()
        session = conv.session
        state = persist.export_session(session)
        entry = Stored(conv.id, conv.config, conv.first, array("l", session.history), conv.reply_start,
                       conv.requests, state.nbytes)  # fmt: skip
        dropped: list[Stored] = []
        if entry.nbytes <= self.swap_bytes:
            entry.state = state.to_host(pin=self.engine.device.type == "cuda")
            spill = []
            with self._lock:
                while self.host and self.host_bytes + entry.nbytes > self.swap_bytes:
                    _, old = self.host.popitem(last=False)
                    spill.append(old)
                    self.spilling[old.id] = old  # still findable while it is written
                self.host[entry.id] = entry
                self.outs["host"] += 1
            dropped = [old for old in spill if not self._spill(old)]
        else:
            path = self._write(entry, state) if self.dir is not None else None
            if path is None:
                return None, dropped
            with self._lock:
                entry.path = path
                self.disk[entry.id] = entry
                self.outs["disk"] += 1
        with self._lock:
            self.bytes["out"] += entry.nbytes
            self.seconds["out"] += time.perf_counter() - t0
        return entry, dropped

    def _spill(self, old: Stored) -> bool:
        """A host session to disk, to make room; False if it is dropped (no disk, or it refused)."""
        path = self._write(old, old.state) if self.dir is not None else None
        with self._lock:
            if self.spilling.pop(old.id, None) is None:  # its conversation came back meanwhile
                if path is not None:
                    self._remove(old.id)
                return True
            if path is None:
                return False
            old.state, old.path = None, path
            self.disk[old.id] = old
            self.outs["disk"] += 1
            return True

    def _write(self, entry: Stored, state: persist.SessionState) -> Path | None:
        """Write `entry` to the session dir (what matching needs, then the session: a kill between
        the two leaves the conversation lost, not paired with an older file); None where the disk
        refuses (full: the session is dropped)."""
        path = self.dir / f"{entry.id}.kvs"
        try:
            atomic_write_json(self.dir / f"{entry.id}.json", _sidecar(entry))
            persist.write(state, self.engine, path)
        except OSError:
            self._remove(entry.id)
            return None
        return path

    def _remove(self, sid: str) -> None:
        for suffix in (".kvs", ".json"):
            (self.dir / f"{sid}{suffix}").unlink(missing_ok=True)

    def save_all(self, convs: list[Any]) -> int:
        """At shutdown (nothing else runs): every session in memory and on the host goes to disk.
        Returns how many were written."""
        if self.dir is None:
            return 0
        out = [(Stored(c.id, c.config, c.first, array("l", c.session.history), c.reply_start, c.requests, 0),
                persist.export_session(c.session)) for c in convs]  # fmt: skip
        out += [(entry, entry.state) for entry in self.host.values()]
        self.host.clear()
        n = 0
        for entry, state in out:
            entry.nbytes = state.nbytes
            path = self._write(entry, state)
            if path is not None:
                entry.state, entry.path = None, path
                self.disk[entry.id] = entry
                self.outs["disk"] += 1
                n += 1
        return n

    # ----------------------------------------------------------------- in
    def bring_back(self, stored: Stored):
        """The claimed conversation's session, live again (a disk file is removed once loaded: the
        session in memory is newer). A ConfigError or OSError where it cannot be read back (its
        files then moved aside): damaged, another model's, or holding another token history than
        the one its conversation was matched by."""
        t0 = time.perf_counter()
        where = "session state" if stored.state is not None else f"session file {stored.path}"
        try:
            state = stored.state if stored.state is not None else persist.read(stored.path, self.engine)
            history = state.tensors["history"].tolist()
            if history != stored.history.tolist():
                raise ConfigError(
                    f"{where}: holds {len(history)} tokens of another conversation than the {len(stored.history)} "
                    f"its conversation {stored.id} was matched by; it is not this conversation's session"
                )
            session = persist.import_session(self.engine, state, where)
        except (ConfigError, OSError, KeyError) as e:
            if stored.path is not None:
                self.set_aside(stored.id, str(e))
            raise ConfigError(str(e)) from None
        if stored.path is not None:
            stored.path.unlink(missing_ok=True)  # its .json stays: the conversation's marker
        with self._lock:
            self.ins[stored.where] += 1
            self.bytes["in"] += stored.nbytes
            self.seconds["in"] += time.perf_counter() - t0
        return session

    def mark(self, conv: Any) -> None:
        """A new conversation's marker in the session dir (its first append): after a kill -9 the
        next server knows it lost this conversation's session and says so (`lost`)."""
        if self.dir is None:
            return
        entry = Stored(conv.id, conv.config, conv.first, array("l", conv.prefix), 0, 0, 0)
        with contextlib.suppress(OSError):  # only a marker: the conversation is served all the same
            atomic_write_json(self.dir / f"{conv.id}.json", _sidecar(entry))

    def set_aside(self, sid: str, why: str) -> None:
        """Move a session's files that cannot be read back to DIR/unreadable (kept for a look, never
        found again as saved sessions), with one log line."""
        moved, dest = [], self.dir / UNREADABLE
        for suffix in (".kvs", ".json"):
            path = self.dir / f"{sid}{suffix}"
            with contextlib.suppress(OSError):
                if path.exists():
                    dest.mkdir(exist_ok=True)
                    os.replace(path, dest / path.name)
                    moved.append(path.name)
        if moved:
            log.warning("kvagent serve: %s moved to %s: %s", " and ".join(moved), dest, " ".join(why.split()))

    def _known(self, folder: Path, sid: str) -> Stored | None:
        """What a conversation's files still tell of it: its .json, else its session file's meta and
        history (unchecked: only to name the conversation whose session is gone); None: nothing."""
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, ConfigError):
            return _read_sidecar(folder / f"{sid}.json")
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, ConfigError):
            meta, history = persist.peek(folder / f"{sid}.kvs")
            first = meta["prompt_length"] or len(history)
            return Stored(sid, CacheConfig(**meta["config"]), first, array("l", history), 0, 0, 0)
        return None

    def _scan(self) -> None:
        """The sessions a previous server left in the session dir. Markers without a session are the
        conversations it lost (killed before saving them): the newest KEEP_LOST are kept. A session
        whose files cannot be read (a .json that does not parse, a .kvs cut short or not a session,
        a .kvs without its .json) is moved aside; its conversation, where known, is `unreadable`.
        Temp files a killed writer left are removed."""
        aside = self.dir / UNREADABLE
        files = [*self.dir.iterdir(), *(aside.iterdir() if aside.is_dir() else [])]
        self.last_id = max([0, *(_number(p.name.lstrip(".").split(".")[0]) for p in files)])
        sids = sorted({_number(p.name.split(".")[0]) for p in files if p.parent == aside} - {-1})
        known = (self._known(aside, f"s{n}") for n in sids[-KEEP_LOST:])
        self.set_aside_before = [entry for entry in known if entry is not None]
        for tmp in self.dir.glob(".*.tmp"):  # fileio's atomic writes: .<name>.<random>.tmp
            if _number(tmp.name[1:].split(".")[0]) >= 0:
                tmp.unlink(missing_ok=True)
        lost = []
        for side in sorted(self.dir.glob("*.json")):
            path = side.with_suffix(".kvs")
            try:
                entry = _read_sidecar(side)
            except (OSError, ValueError, KeyError, TypeError, ConfigError) as e:
                if SID.fullmatch(side.stem):  # ours, and damaged: set aside (its session with it)
                    if (named := self._known(self.dir, side.stem)) is not None:
                        self.unreadable.append(named)  # known from its session file: it says so
                    self.set_aside(side.stem, f"its .json cannot be read ({type(e).__name__}: {e})")
                continue  # not ours: ignored, never deleted
            if not path.exists():
                lost.append(entry)
                continue
            try:
                persist.inspect(path, self.engine)  # the header only: the data is checked on the way in
            except (ConfigError, OSError) as e:
                self.set_aside(entry.id, str(e))
                self.unreadable.append(entry)
                continue
            self.disk[entry.id] = entry
        for path in self.dir.glob("*.kvs"):
            if SID.fullmatch(path.stem) and not path.with_suffix(".json").exists():
                self.set_aside(
                    path.stem, "a session file without its .json (the conversation it belongs to is unknown)"
                )
        lost.sort(key=lambda e: _number(e.id))  # ids grow: the highest are the newest
        for entry in lost[:-KEEP_LOST]:
            (self.dir / f"{entry.id}.json").unlink(missing_ok=True)
        self.lost = lost[-KEEP_LOST:]

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> dict[str, Any]:
        return {
            "swapped": len(self.host),
            "on_disk": len(self.disk),
            "swap_bytes": self.host_bytes,
            "swap_space": self.swap_bytes,
            "swap_outs": dict(self.outs),
            "swap_ins": dict(self.ins),
            "swap_moved_bytes": dict(self.bytes),
            "swap_seconds": dict(self.seconds),
        }


def _number(sid: str) -> int:
    m = SID.fullmatch(sid)
    return int(m[1]) if m else -1


def _read_sidecar(side: Path) -> Stored:
    d = json.loads(side.read_text())
    return Stored(side.stem, CacheConfig(**d["config"]), d["first"], array("l", d["history"]), d["reply_start"],
                  d["requests"], d["nbytes"], path=side.with_suffix(".kvs"))  # fmt: skip


def _sidecar(entry: Stored) -> dict[str, Any]:
    return {
        "config": entry.config.to_dict(),
        "first": entry.first,
        "history": entry.history.tolist(),
        "reply_start": entry.reply_start,
        "requests": entry.requests,
        "nbytes": entry.nbytes,
    }
