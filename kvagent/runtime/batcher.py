"""Continuous batching: the engine's batcher joins concurrent sessions' forwards into one.

Each session runs in its caller's thread and does its own bookkeeping and eviction; only the model
forward is handed over. A calling thread posts a `Chunk` and blocks; the batcher thread takes
every pending chunk (up to `max_batch` and a token cap), runs one packed forward (`forward.py`) and
wakes the callers (`pick` chooses them). With a `prefill_budget`, while decode tokens wait a
forward takes at most that many prefill tokens beside them (always at least one prefill chunk, so
none starves): a burst of prompt chunks spreads over several steps (vLLM's chunked-prefill token
budget). Off by default: on a CPU a forward's cost grows with its tokens alike for prefill and
decode rows, so spreading the same prompt tokens over more steps only delays the prompts; measured
0.94x the per-session decode rate and 0.93x the output rate of no budget (docs/benchmarks.md,
benchmarks/prefill_budget.py).

To fill a batch it waits until every session that is inside an API call (or
left one within the wait window: a caller looping over `step` is between two calls) has posted,
but never longer than the wait window after the oldest post: max(`max_wait_s`, a tenth of the
last forward), so a session busy with an eviction round joins the next forward instead of
stalling the others. A session joins or leaves at any step.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time

from kvagent.runtime.forward import Chunk, run_forward

MAX_WAIT_S = 0.002
MAX_TOKENS = 4096  # tokens per packed forward (bounds activations when many sessions prefill)
PREFILL_BUDGET = None  # prefill tokens a forward takes beside decode tokens (None: max_tokens alone)


class Batcher:
    def __init__(
        self,
        engine,
        max_batch: int,
        max_wait_s: float = MAX_WAIT_S,
        max_tokens: int = MAX_TOKENS,
        prefill_budget: int | None = PREFILL_BUDGET,
    ):
        self.engine = engine
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.max_tokens = max_tokens
        self.prefill_budget = prefill_budget  # None: only max_tokens bounds a forward's prefill
        self._cond = threading.Condition()
        self._pending: list[tuple[float, Chunk, threading.Event]] = []
        self._in_call: dict[int, int] = {}  # id(session) -> call depth
        self._left_at: dict[int, float] = {}  # id(session) -> when it last left a call
        self._last_forward_s = 0.0
        self._last_forward_end = 0.0
        self._thread: threading.Thread | None = None
        self._closed = False
        self.forwards = 0  # packed forwards run
        self.rows = 0  # chunks served (rows / forwards = mean batch)
        self.widest_run = 0  # most decode tokens one batched attention call has served

    @contextlib.contextmanager
    def active(self, session):
        """Marks a session as inside an API call, so the batcher waits for its next forward."""
        key = id(session)
        with self._cond:
            self._in_call[key] = self._in_call.get(key, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                depth = self._in_call.pop(key) - 1
                if depth:
                    self._in_call[key] = depth
                else:
                    self._left_at[key] = time.perf_counter()
                self._cond.notify_all()

    def forward(self, chunk: Chunk) -> None:
        """Post `chunk` and wait until a packed forward has run it (its logits or error set)."""
        done = threading.Event()
        with self._cond:
            if self._closed:
                raise RuntimeError("engine closed: its batcher no longer runs forwards")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="kvagent-batcher", daemon=True)
                self._thread.start()
            self._pending.append((time.perf_counter(), chunk, done))
            self._cond.notify_all()
        done.wait()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _take(self) -> list[tuple[float, Chunk, threading.Event]] | None:
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if self._closed and not self._pending:
                return None
            window = max(self.max_wait_s, 0.1 * self._last_forward_s)
            # From the later of the oldest post and the last forward's end: a chunk posted while the
            # previous forward ran must still wait for the sessions that forward just served, or
            # two sessions fall into taking turns (each forward alone) and never batch again.
            deadline = max(self._pending[0][0], self._last_forward_end) + window
            while len(self._pending) < min(self.max_batch, self._expected(window)):
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._cond.wait(left)
            chosen = pick([len(c.ids) for _, c, _ in self._pending], self.max_batch, self.max_tokens,
                          self.prefill_budget)  # fmt: skip
            batch = [self._pending[i] for i in chosen]
            taken = set(chosen)
            self._pending = [item for i, item in enumerate(self._pending) if i not in taken]
            return batch

    def _expected(self, window: float) -> int:
        """Sessions likely to post soon: inside a call, or out of one for less than `window`."""
        now = time.perf_counter()
        for key in [k for k, t in self._left_at.items() if now - t > window or k in self._in_call]:
            del self._left_at[key]
        return len(self._in_call) + len(self._left_at)

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            self._serve(batch)
            # Hold no finished forward's chunks (their caches, logits) while waiting for the next.
            del batch

    def _serve(self, batch: list[tuple[float, Chunk, threading.Event]]) -> None:
        # Sessions in consecutive slots side by side, so their decode tokens form one run.
        chunks = sorted((c for _, c, _ in batch), key=_slot_order)
        t0 = time.perf_counter()
        try:
            self.widest_run = max(self.widest_run, run_forward(self.engine, chunks))
            self._last_forward_end = time.perf_counter()
            self._last_forward_s = self._last_forward_end - t0
        except BaseException as e:  # handed to every caller of this forward
            for c in chunks:
                c.error = e
        self.forwards += 1
        self.rows += len(chunks)
        for _, _, done in batch:
            done.set()


def pick(sizes: list[int], max_batch: int, max_tokens: int, prefill_budget: int | None) -> list[int]:
    """Which pending chunks (their token counts, oldest first) the next forward takes, as indices:
    up to `max_batch` chunks and `max_tokens` tokens, the oldest always; with a decode token among
    them, prompt tokens only up to `prefill_budget` (at least one prompt chunk)."""
    budget = prefill_budget if any(q == 1 for q in sizes) else None  # nothing decodes: no budget
    chosen, tokens, prefill = [], 0, 0
    for i, q in enumerate(sizes):
        if len(chosen) == max_batch:
            break
        if chosen and tokens + q > max_tokens:
            continue  # a later, shorter chunk (a decode token) may still fit
        if q > 1 and budget is not None and prefill and prefill + q > budget:
            continue
        chosen.append(i)
        tokens += q
        prefill += q if q > 1 else 0
    return chosen


def _slot_order(c: Chunk):
    s = c.cache.slot
    return (1, 0, 0, 0) if s is None else (0, id(s.pool), s.block_index, s.index)


def in_call(method):
    """Session methods that may run forwards: tell the engine's batcher (if any) we are in one."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        batcher = self.engine.batcher
        if batcher is None:
            return method(self, *args, **kwargs)
        with batcher.active(self):
            return method(self, *args, **kwargs)

    return wrapper
