"""Time caps: the run is planned as parts with a cap each, on one schedule, so a part that finishes
early leaves its time to the next and one that overruns shrinks the rest; the whole run never
passes its total. A unit of work starts only if its predicted cost fits its part's remaining time."""

from __future__ import annotations

import time


class Clock:
    def __init__(self, total_s: float, caps: dict[str, float]) -> None:
        self.start = time.perf_counter()
        self.deadline = self.start + total_s
        self.ends: dict[str, float] = {}
        t = self.start
        for part, cap in caps.items():
            t += cap
            self.ends[part] = min(t, self.deadline)
        self.costs: dict[str, list[float]] = {p: [] for p in caps}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def remaining(self, part: str) -> float:
        return self.ends[part] - time.perf_counter()

    def allows(self, part: str, need: float | None = None) -> bool:
        """May a unit of `part` costing `need` seconds start? Without `need`, the costliest unit
        of that part so far is the prediction."""
        if need is None:
            need = max(self.costs[part], default=0.0)
        return 0.0 <= need <= self.remaining(part)

    def tick(self, part: str, seconds: float) -> None:
        self.costs[part].append(seconds)
