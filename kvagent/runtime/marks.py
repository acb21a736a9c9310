"""Segment marks: where each segment (a reply, a tool output) starts in a session's history, for the
segment-aware policy (policies/segments.py). Set by the agent loop, replays and the server, never
guessed from text; they follow the history as forget and rewind change it."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence


class SegmentMarks(list):
    """Ascending distinct positions (a list, as rounds and saved sessions read it)."""

    def __init__(self, positions: Iterable[int] = ()) -> None:
        super().__init__(sorted({int(p) for p in positions}))

    def add(self, position: int) -> None:
        at = bisect.bisect_left(self, position)
        if at == len(self) or self[at] != position:
            self.insert(at, position)

    def forget(self, drop: Sequence[int]) -> None:
        """`drop` (sorted) left the history and later tokens shifted down: the marks shift with them,
        and one on a dropped token moves to the next one kept (its segment starts there now)."""
        self[:] = sorted({m - bisect.bisect_left(drop, m) for m in self})

    def cut(self, length: int) -> None:
        """The history was cut to `length`: marks past it named tokens taken back; one at it starts
        whatever is fed next."""
        del self[bisect.bisect_right(self, length) :]
