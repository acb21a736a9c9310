"""Requests run on worker threads, one session per thread, as many at once as the engine batches
(`max_batch`; its batcher joins their forwards), behind a bounded queue. A job reports back to
its HTTP handler through an asyncio queue: `started` once its prompt is in the cache (errors
before then become a 4xx response), `text` as the reply grows (streaming only), then `done` or
`error`. Its cancel flag (client gone, shutdown) ends the reply at the next token. The reply is
`Session.generate`'s, with the request's options (`ReplySpec`), so a server reply is the library's
reply on the same token stream."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kvagent.runtime import CacheConfig, Generation, Sampling
from kvagent.runtime.generation import Stopping
from kvagent.serve.conversations import Conversations, Plan
from kvagent.serve.errors import Busy

_STATS = ("prefill_tokens", "decode_tokens", "rounds", "evicted")


@dataclass
class ReplySpec:
    """A request's reply options, as `Session.generate` takes them."""

    max_tokens: int
    sampling: Sampling
    seed: int  # the request's (a random one when it gives none)
    stopping: Stopping = field(default_factory=Stopping)


@dataclass
class Event:
    kind: str  # "started" | "text" | "done" | "error"
    value: Any = None


@dataclass(eq=False)
class Job:
    prompt: list[int]
    first: int  # a new session's first append: prompt[:first] (render.Prompt)
    config: CacheConfig
    spec: ReplySpec
    stream: bool
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)
    require_session: bool = False  # kv_require_session
    continues: bool = False  # the prompt holds an earlier reply of its conversation
    # kv_history on a persistent session: (M, each tool output's content span in the prompt)
    mask: tuple[int, list[tuple[int, int]]] | None = None
    marks: list[int] = field(default_factory=list)  # segment starts in the prompt (segments policy)

    def emit(self, kind: str, value: Any = None) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is gone (shutdown): nobody listens
            self.loop.call_soon_threadsafe(self.events.put_nowait, Event(kind, value))


@dataclass
class Outcome:
    plan: Plan
    decoded: Generation
    usage: dict[str, Any]
    stats: dict[str, Any]  # the session's CacheStats after the reply, plus this request's deltas
    delta: dict[str, int]


def _counts(stats) -> dict[str, int]:
    return {k: int(getattr(stats, k)) for k in _STATS}


def _feed(session, job: Job, plan: Plan) -> int:
    """Append the prompt's new tokens, their segments marked: a new session's chat head first (its
    protected prompt), then the rest. With `job.mask` (kv_history, persistent), as the agent loop masks (agent/history.py):
    before a tool output's content is fed, those it pushes out of the newest M are forgotten, and
    those the session or the head already holds are forgotten first. Returns positions forgotten."""
    prompt, pos = job.prompt, plan.keep
    for m in job.marks:  # those in the part kept were marked when it was fed
        if m >= pos:
            session.mark_segment(m)
    if plan.status == "new":
        pos = min(plan.conv.first, len(prompt))
        session.append(prompt[:pos])
    if job.mask is None:
        if pos < len(prompt):
            session.append(prompt[pos:])
        return 0
    from kvagent.agent.history import newly_masked

    keep, spans = job.mask
    masked = forgotten = 0

    def forget(upto: int) -> None:
        nonlocal masked, forgotten
        drop = [p for a, b in spans[masked:upto] for p in range(a, b)]
        forgotten += session.forget(drop) if drop else 0
        masked = max(masked, upto)

    forget(max(0, sum(b <= pos for _, b in spans) - keep))
    for j, (a, _) in enumerate(spans):
        todo = newly_masked(j, keep, masked) if a >= pos else range(0)
        if len(todo):
            if a > pos:
                session.append(prompt[pos:a])
                pos = a
            forget(todo.stop)
    if pos < len(prompt):
        session.append(prompt[pos:])
    return forgotten


def serve_job(conversations: Conversations, job: Job) -> Outcome:
    """Continue (or start) the prompt's conversation and sample its reply."""
    plan = conversations.lease(job.prompt, job.config, job.first, job.require_session, job.continues)
    conv = plan.conv
    session = conv.session
    healthy = False
    try:
        before = _counts(session.stats)
        if plan.rewind:
            session.rewind(plan.rewind)
        forgotten = _feed(session, job, plan)
        conv.reply_start = job.first  # the newest reply, with the generation prompt before it
        job.emit("started", plan)
        on_text = (lambda text: job.emit("text", text)) if job.stream else None
        spec = job.spec
        decoded = session.generate(
            spec.max_tokens,
            spec.sampling,
            seed=spec.seed,
            stopping=spec.stopping,
            on_token=lambda _id: job.cancel.is_set(),  # client gone, or shutdown: end at this token
            on_text=on_text,
        )
        stats = session.stats
        healthy = True
    finally:
        if healthy:
            conversations.release(conv, stats.total_kv_bytes)
        else:  # a failed append or step may leave the cache half-updated: never continue it
            conversations.discard(conv)
    after = _counts(stats)
    delta = {k: after[k] - before[k] for k in _STATS}
    delta = {"prefill_tokens": delta["prefill_tokens"], "decode_tokens": delta["decode_tokens"],
             "eviction_rounds": delta["rounds"], "evicted_entries": delta["evicted"]}  # fmt: skip
    m = len(job.prompt)
    usage = {
        "prompt_tokens": m,
        "completion_tokens": len(decoded.ids),
        "total_tokens": m + len(decoded.ids),
        "prompt_tokens_details": {"cached_tokens": plan.keep},
        "kv_continued_tokens": plan.keep,
        "kv_appended_tokens": m - plan.keep,
        "kv_rewound_tokens": plan.rewind,
        "kv_reprefilled_tokens": plan.reprefilled,
        "kv_prefill_tokens": delta["prefill_tokens"],
        "kv_forgotten_tokens": forgotten,
        "kv_session_restored": plan.restored,  # where a moved-out session came back from: host, disk, none
    }
    info = {
        "session": conv.id,
        "status": plan.status,
        "reason": plan.reason,
        "cause": plan.cause,  # reason dropped: kv_memory, max_sessions, lost or unreadable
        "divergence": plan.depth,
        "requests": conv.requests,
        "logical_length": stats.logical_length,
        "rounds": stats.rounds,
        "evicted": stats.evicted,
        "kv_bytes": stats.total_kv_bytes,
        "eviction_rounds_this_request": delta["eviction_rounds"],
        "policy": job.config.policy,
        "budget": job.config.budget,
        "mode": job.config.mode,
    }
    return Outcome(plan, decoded, usage, info, delta)


class Runner:
    def __init__(self, engine: Any, conversations: Conversations, max_queue: int) -> None:
        self.engine = engine
        self.conversations = conversations
        self.workers = engine.max_batch
        self.capacity = self.workers + max_queue
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="kvagent-serve")
        self._cond = threading.Condition()
        self._jobs: set[Job] = set()
        self.waiting = 0
        self.running = 0
        self.accepting = True

    def submit(self, job: Job) -> None:
        with self._cond:
            if not self.accepting:
                raise Busy("server: shutting down; send the request to another server", status=503)
            if len(self._jobs) >= self.capacity:
                raise Busy(
                    f"server: busy ({self.running} running, {self.waiting} queued, the most it admits); retry "
                    "later or raise --max-queue",
                    status=429,
                )
            self._jobs.add(job)
            self.waiting += 1
        self._pool.submit(self._run, job)

    def _run(self, job: Job) -> None:
        with self._cond:
            self.waiting -= 1
            self.running += 1
        try:
            if job.cancel.is_set():
                job.emit("error", Busy("server: the request was cancelled before it ran", status=503))
                return
            job.emit("done", serve_job(self.conversations, job))
        except BaseException as e:  # handed to the request's handler, which answers with it
            job.emit("error", e)
        finally:
            with self._cond:
                self.running -= 1
                self._jobs.discard(job)
                self._cond.notify_all()

    def drain(self, timeout: float) -> None:
        """Stop admitting; let in-flight requests finish for up to `timeout` seconds, then cancel
        the rest (each stops at its next token) and wait for the workers."""
        with self._cond:
            self.accepting = False
            deadline = time.monotonic() + timeout
            while self._jobs and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            for job in self._jobs:
                job.cancel.set()
        self._pool.shutdown(wait=True, cancel_futures=False)

    def state(self) -> dict[str, int]:
        with self._cond:
            return {"waiting": self.waiting, "running": self.running, "capacity": self.capacity}
