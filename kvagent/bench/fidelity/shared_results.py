"""One results directory worked on by several processes at once (`kvagent bench fidelity` or
`bench study` started N times on the same OUT): on a CPU, N processes of one torch thread each run
N replays at a time, where threads in one process would share one forward. Each run is claimed
before it starts (a file under OUT/running naming the claiming process) and each finished record is
merged into the results file under a lock, so no run is done twice, none is lost, and a process that
dies leaves only its run in progress: its claim names a dead process, which the next claimant
ignores. Processes on one machine (a claim's owner is checked by pid and start time)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import uuid
from pathlib import Path

from kvagent.errors import ConfigError
from kvagent.fileio import atomic_write_json
from kvagent.sandbox.owner import process_start, still_running

RUNNING = "running"  # directory under the out dir: one claim file per run in progress
LOCK = ".results.lock"


def read_records(path: Path) -> list[dict]:
    """The records of a results file as it is now ([] if there is none)."""
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e.msg}); move it away to start afresh") from None
    return list(data.get("records", []))


class SharedResults:
    """`results` (a JSON file of {"records": [...], "skipped": [...]}) and its run claims; `key` turns
    a record into what makes two records the same run."""

    def __init__(self, results: Path, key):
        self.path = Path(results)
        self.key = key
        self.claims = self.path.parent / RUNNING
        me = os.getpid()
        # the start time too, so a claim whose pid a new process took counts as its owner's, gone
        self.owner = {"pid": me, "start": process_start(me) or "0", "token": uuid.uuid4().hex}

    @contextlib.contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.parent / LOCK, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _claim_file(self, key) -> Path:
        return self.claims / (hashlib.sha1(repr(key).encode()).hexdigest()[:20] + ".json")

    def read(self) -> list[dict]:
        return read_records(self.path)

    def claim(self, key) -> bool:
        """Take the run `key` unless it is done or another live process (or another SharedResults
        in this one) has it."""
        with self._locked():
            if any(self.key(r) == key for r in self.read()):
                return False
            f = self._claim_file(key)
            try:
                held = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                held = None
            if (
                held
                and held != self.owner
                and still_running(int(held.get("pid", -1)), str(held.get("start", "0")))
            ):
                return False
            atomic_write_json(f, self.owner)
            return True

    def release(self, key) -> None:
        with self._locked():
            self._release(key)

    def _release(self, key) -> None:  # under the lock
        f = self._claim_file(key)
        with contextlib.suppress(OSError, json.JSONDecodeError):
            if json.loads(f.read_text(encoding="utf-8")) == self.owner:
                f.unlink()

    def save(self, record: dict | None, skipped: list[str]) -> list[dict]:
        """Merge `record` (None: nothing new) into the file as it is now (other processes' records
        kept), release its claim; returns every record."""
        key = None if record is None else self.key(record)
        with self._locked():
            records = self.read()
            if key is not None and all(self.key(r) != key for r in records):
                records.append(record)
            atomic_write_json(self.path, {"records": records, "skipped": skipped})
            if key is not None:
                self._release(key)
        return records
