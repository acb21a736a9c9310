"""Capped, deadline-bounded reading of a byte stream (a pipe or a docker exec stream).

The reader runs in a thread so the caller can stop waiting at the deadline even when a stray
background process keeps the stream open; memory stays bounded because bytes past the cap are
counted and dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable


class CappedReader:
    def __init__(self, chunks: Iterable[bytes], max_bytes: int):
        self.max_bytes = max_bytes
        self._kept = bytearray()
        self.dropped = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, args=(chunks,), daemon=True)
        self._thread.start()

    def _pump(self, chunks: Iterable[bytes]) -> None:
        try:
            for chunk in chunks:
                if not chunk:
                    continue
                with self._lock:
                    room = self.max_bytes - len(self._kept)
                    if room > 0:
                        self._kept += chunk[:room]
                    self.dropped += max(0, len(chunk) - max(room, 0))
        except Exception:  # a closed stream ends the read; whatever arrived is kept
            pass

    def join(self, timeout: float | None) -> bool:
        """Wait for end of stream; True if it ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def data(self) -> tuple[bytes, int]:
        with self._lock:
            return bytes(self._kept), self.dropped


def pipe_chunks(read: Callable[[int], bytes], size: int = 65536) -> Iterable[bytes]:
    while True:
        chunk = read(size)
        if not chunk:
            return
        yield chunk
