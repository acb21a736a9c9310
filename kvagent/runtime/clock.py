"""How long eviction rounds take (`CacheStats.scoring_s`, `compaction_s`) without stalling them.

On a CPU the host's clock is the round's. On a GPU the host runs ahead of the kernels it queues, so
a host clock measures launches, and synchronising the device around every round (what makes a host
clock honest) costs more than many rounds. There, each round records CUDA events (start, scored,
compacted) on the current stream and the seconds are added to the stats once the events have
completed: polled without blocking at each round, and waited for (`settle`) when the stats are read.
`SYNC = True` (profiling: the GPU benchmark's `--sync-rounds`) synchronises the device around each
part instead, so a profile's timeline shows each round whole.
"""

from __future__ import annotations

import time

import torch

from kvagent.runtime.stats import CacheStats

SYNC = False  # synchronise the device around each round's parts (profiling only)


class RoundClock:
    def __init__(self, device: torch.device, stats: CacheStats) -> None:
        self.stats = stats
        cuda = device.type == "cuda"
        self.sync = SYNC and cuda
        self.events = cuda and not SYNC
        self._pending: list[tuple[torch.cuda.Event, torch.cuda.Event, torch.cuda.Event]] = []
        self._marks: list = []

    def start(self) -> None:
        self._marks = [self._mark()]

    def scored(self) -> None:
        self._marks.append(self._mark())

    def compacted(self) -> None:
        self._marks.append(self._mark())
        t0, t1, t2 = self._marks
        if self.events:
            self._pending.append((t0, t1, t2))
            self.settle(wait=False)
        else:
            self.stats.scoring_s += t1 - t0
            self.stats.compaction_s += t2 - t1

    def settle(self, wait: bool = True) -> None:
        """Add the rounds whose events have completed (all of them with `wait`) to the stats."""
        while self._pending:
            t0, t1, t2 = self._pending[0]
            if not wait and not t2.query():
                return
            t2.synchronize()
            self.stats.scoring_s += t0.elapsed_time(t1) / 1000
            self.stats.compaction_s += t1.elapsed_time(t2) / 1000
            self._pending.pop(0)

    def _mark(self):
        if self.events:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()
