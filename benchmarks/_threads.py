"""Timing concurrent sessions the way the batched engine sees them: every thread starts at one
barrier (so no session gets a head start), the clock runs until the last one joins, and the first
error any thread raised is raised here (a silent thread would time a shorter run)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def run_together(jobs: list[Callable[[], object]]) -> float:
    """Wall seconds from the common start of `jobs` (one thread each) until all have finished."""
    barrier = threading.Barrier(len(jobs) + 1)
    errors: list[BaseException] = []

    def drive(job):
        try:
            barrier.wait()
            job()
        except BaseException as e:  # re-raised below, in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=drive, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return elapsed
