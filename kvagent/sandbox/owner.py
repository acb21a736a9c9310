"""Who owns a sandbox, and the sweep that removes sandboxes whose owner process is gone.

A local sandbox's temp dir is named `kvagent-sbx-<pid>-<start>-<random>` and a container carries
the labels `kvagent.owner.pid/start/host`: the process that opened it, with its start time so a
reused pid is not mistaken for the owner. The record is written atomically with the sandbox (the
name, the labels at create), so there is no moment a sandbox exists without its owner. SIGKILL
skips every cleanup; the sweep, run once per process before its first sandbox and by
`kvagent clean`, removes what such a process left behind, and ends any command of its still
running (bwrap's --die-with-parent misses an owner killed while bwrap starts).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from kvagent.sandbox import reaper

log = logging.getLogger(__name__)

DIR_PREFIX = "kvagent-sbx-"
LABEL = "kvagent.sandbox"
PID_LABEL, START_LABEL, HOST_LABEL = "kvagent.owner.pid", "kvagent.owner.start", "kvagent.owner.host"
_OWNED_DIR = re.compile(rf"^{re.escape(DIR_PREFIX)}(\d+)-(\d+)-")
# Signals that stop a run (cli/signals.py turns them into KeyboardInterrupt); held back while a
# sandbox is being removed, so a second one cannot strand it half removed.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), "" where /proc has none,
    None when there is no such process or it is a zombie (dead, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None
        return "" if _pid_exists(pid) else None
    except OSError:
        return ""
    fields = stat[stat.rfind(")") + 2 :].split()  # comm may hold spaces and parentheses
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


def still_running(pid: int, start: str = "0") -> bool:
    """Whether process `pid` on this host is still the one that started at `start` (its
    `process_start` when it was recorded; "0" or "": not known, then any live process of that pid
    counts): the one check of "is this process still the one we started", so a reused pid is not
    taken for the process that is gone. Sandboxes' owners, Ray actors' run dirs and bench claims ask it."""
    now = process_start(pid)
    if now is None:
        return False
    return not (now and start not in ("0", "") and now != start)  # the pid was reused


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Owner:
    pid: int
    start: str
    host: str

    @classmethod
    def me(cls) -> Owner:
        return cls(os.getpid(), process_start(os.getpid()) or "0", socket.gethostname())

    def alive(self) -> bool:
        """False only when this host can tell the owner is gone; an owner on another host (a
        shared Docker daemon) counts as alive."""
        return self.host != socket.gethostname() or still_running(self.pid, self.start)

    def labels(self) -> dict[str, str]:
        return {PID_LABEL: str(self.pid), START_LABEL: self.start, HOST_LABEL: self.host}


def owner_of_dir(name: str) -> Owner | None:
    m = _OWNED_DIR.match(name)
    return Owner(int(m.group(1)), m.group(2), socket.gethostname()) if m else None


def owner_of_labels(labels: dict[str, str]) -> Owner | None:
    try:
        return Owner(int(labels[PID_LABEL]), labels[START_LABEL], labels[HOST_LABEL])
    except (KeyError, ValueError):
        return None


def make_dir() -> str:
    """A new sandbox temp dir whose name records this process as its owner."""
    me = Owner.me()
    return os.path.realpath(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{me.pid}-{me.start}-"))


def rmtree(path: str) -> None:
    def onerror(func, p, _exc):  # files the agent made read-only must still go
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    with held_signals():
        shutil.rmtree(path, onerror=onerror)


class held_signals:  # noqa: N801 - used like a function: `with held_signals():`
    """Hold back SIGINT/SIGTERM/SIGHUP for the block, then deliver them: removing a sandbox is
    never cut short by a second Ctrl-C or `kill`. Only the main thread receives signals, so
    elsewhere this does nothing."""

    def __enter__(self):
        self.got: list[int] = []
        self.old: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                if signal.getsignal(sig) is None:  # set outside Python: cannot be put back
                    continue
                with contextlib.suppress(ValueError, OSError):  # not the main interpreter
                    self.old[sig] = signal.signal(sig, self._note)
        return self

    def _note(self, signum, _frame):
        self.got.append(signum)

    def __exit__(self, *exc):
        for sig, handler in self.old.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(self.got):
            if self.old.get(sig) != signal.SIG_IGN:
                signal.raise_signal(sig)


# ----------------------------------------------------------------------------- this process's sandboxes
_live: weakref.WeakSet = weakref.WeakSet()
_swept: set[str] = set()
_sweep_lock = threading.Lock()


def track(sandbox: Any) -> None:
    _live.add(sandbox)


def untrack(sandbox: Any) -> None:
    _live.discard(sandbox)


@atexit.register
def _close_all() -> None:
    for sb in list(_live):
        with contextlib.suppress(Exception):
            sb.close()


# ----------------------------------------------------------------------------- the sweep
def sweep_dirs(tmp: str | None = None, ownerless_after: float | None = None) -> list[str]:
    """Remove this user's sandbox dirs in `tmp` whose owner is gone; with `ownerless_after`, also
    those with no owner in their name (made before owners were recorded) untouched that long."""
    tmp = tmp or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(tmp))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(DIR_PREFIX):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not entry.is_dir(follow_symlinks=False) or st.st_uid != os.getuid():
            continue
        owner = owner_of_dir(entry.name)
        if owner is None:
            if ownerless_after is None or time.time() - st.st_mtime < ownerless_after:
                continue
        elif owner.alive():
            continue
        reaper.kill_marked(os.path.realpath(entry.path))  # a command the dead owner left running
        rmtree(entry.path)
        removed.append(entry.path)
    return removed


def sweep_containers(client: Any, ownerless_after: float | None = None) -> list[str]:
    """Remove sandbox containers whose owner on this host is gone (and, with `ownerless_after`,
    unlabelled ones created that long ago). Returns their names."""
    import docker.errors

    removed = []
    for c in client.containers.list(all=True, filters={"label": LABEL}):
        labels = c.labels or {}
        owner = owner_of_labels(labels)
        if owner is None:
            if ownerless_after is None or _age_s(c.attrs.get("Created", "")) < ownerless_after:
                continue
        elif owner.alive():
            continue
        with held_signals(), contextlib.suppress(docker.errors.NotFound):
            client.api.remove_container(c.id, force=True, v=True)
        removed.append(c.name)
    return removed


def _age_s(created: str) -> float:
    try:  # docker writes nanoseconds; fromisoformat takes at most microseconds
        stamp = re.sub(r"(\.\d{6})\d*", r"\1", created).replace("Z", "+00:00")
        return time.time() - datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return 0.0


def sweep_once(kind: str, client: Any = None) -> None:
    """The startup sweep: once per process and kind ("dirs" or "containers"), before the first
    sandbox; a failure is logged, never raised (it must not stop a run)."""
    with _sweep_lock:
        if kind in _swept:
            return
        _swept.add(kind)
    try:
        removed = sweep_dirs() if kind == "dirs" else sweep_containers(client)
    except Exception as e:  # e.g. a daemon error while listing
        log.debug("sandbox sweep (%s) failed: %s", kind, e)
        return
    if removed:
        log.info("removed %d sandbox(es) left by killed kvagent processes", len(removed))
