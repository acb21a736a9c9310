"""Batched-equals-solo checks: the same episodes run one after another on a solo engine and all at
once on a batching engine (max_batch > 1), then compared session by session."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kvagent.runtime.oracle import trace

Episode = Callable[[Any, int], Any]  # (session, index) -> what the comparison needs


def run_alone(engine, cfgs: Sequence, episode: Episode) -> list[tuple[Any, Any]]:
    """(session, episode result) per config, each session made and run to its end before the next."""
    results = []
    for i, cfg in enumerate(cfgs):
        s = engine.session(cfg)
        results.append((s, episode(s, i)))
    return results


def run_together(engine, cfgs: Sequence, episode: Episode, traced: bool = True):
    """One thread per session, all released at once so their forwards batch. With `traced`, each
    persistent session's forwards are recorded for the oracle. Returns sessions, results, traces
    (None where not traced); the first error of any thread is raised here."""
    sessions = [engine.session(cfg) for cfg in cfgs]
    results, records, errors = [None] * len(cfgs), [None] * len(cfgs), []
    barrier = threading.Barrier(len(cfgs))

    def drive(i):
        try:
            barrier.wait()
            s = sessions[i]
            if traced and s.config.mode == "persistent":
                with trace(s) as rec:
                    results[i] = episode(s, i)
                records[i] = rec
            else:
                results[i] = episode(s, i)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(len(cfgs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sessions, results, records


def assert_same_logits_and_kept(solo_session, solo_logits, session, logits, tol: float) -> None:
    """Every call's logits within `tol`, and the same positions kept in every layer and head."""
    for a, b in zip(solo_logits, logits, strict=True):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)
    for a, b in zip(solo_session.kept_positions(), session.kept_positions(), strict=True):
        assert torch.equal(a, b)
