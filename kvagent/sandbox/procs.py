"""Capped, deadline-bounded reading of a byte stream (a pipe or a docker exec stream).

The reader runs in a thread so the caller can stop waiting at the deadline even when a stray
background process keeps the stream open. Memory stays bounded: past the cap, the first half of
the cap (the head) and the newest bytes up to the other half (the tail) are kept and the middle is
counted and dropped. The tail matters as much as the head: a tool's own truncation (R2E-Gym's
execute_bash keeps 40 lines from each end) and a command's last words (an error, a `[STDERR]`
section printed after a long stdout) are at the end.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable


class CappedReader:
    def __init__(self, chunks: Iterable[bytes], max_bytes: int):
        self.max_bytes = max_bytes
        self.head_max = max_bytes // 2
        self.tail_max = max_bytes - self.head_max
        self._head = bytearray()
        self._tail = bytearray()
        self.dropped = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, args=(chunks,), daemon=True)
        self._thread.start()

    def _pump(self, chunks: Iterable[bytes]) -> None:
        try:
            for chunk in chunks:
                if chunk:
                    self._take(chunk)
        except Exception:  # a closed stream ends the read; whatever arrived is kept
            pass

    def _take(self, chunk: bytes) -> None:
        with self._lock:
            room = self.head_max - len(self._head)
            if room > 0:
                self._head += chunk[:room]
                chunk = chunk[room:]
            if not chunk:
                return
            self._tail += chunk
            excess = len(self._tail) - self.tail_max
            if excess > 0:  # the oldest tail bytes become the dropped middle
                del self._tail[:excess]
                self.dropped += excess

    def join(self, timeout: float | None) -> bool:
        """Wait for end of stream; True if it ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def parts(self) -> tuple[bytes, bytes, int]:
        """(head, tail, bytes dropped between them); head + tail is the whole output when none were."""
        with self._lock:
            return bytes(self._head), bytes(self._tail), self.dropped

    def data(self) -> tuple[bytes, int]:
        """(head + tail, bytes dropped between them)."""
        head, tail, dropped = self.parts()
        return head + tail, dropped

    def output(self, note: Callable[[int], bytes]) -> bytes:
        """The kept bytes with `note(dropped)` where the middle was cut (nothing when none was)."""
        head, tail, dropped = self.parts()
        return head + note(dropped) + tail if dropped else head + tail


def pipe_chunks(read: Callable[[int], bytes], size: int = 65536) -> Iterable[bytes]:
    while True:
        chunk = read(size)
        if not chunk:
            return
        yield chunk
