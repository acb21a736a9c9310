"""The live conversations: one Session each, matched to a request by the longest common token
prefix of the request's prompt and the session's exact history (prompt, appended turns, and the
reply tokens it generated), so only the new tokens are appended.

Clients re-render the history they send (Qwen3's template drops earlier <think> blocks, R2E-Gym
re-serialises earlier calls, and a decoded reply rarely re-encodes to the sampled ids), so the
stream and the prompt part where the newest reply begins. The session rewinds to the divergence
(`Session.rewind`: the newest tokens leave the stream with no position gap) and appends the
client's version. A divergence before the newest reply (a client that rewrote older turns or
forked the conversation) is rewound the same way, exact in positions, and counted apart
("deeper"): what eviction rounds dropped while the rewound tokens were in the cache stays dropped
(persistent mode: eviction is irreversible). A divergence inside the first append cannot be
rewound (Session.rewind never reaches into it): the request starts a new session. That is why a
chat session's first append stops before the generation prompt (render.Prompt.first): a client
that drops the reply it got and adds a turn, or asks the first turn again, still continues.

A session serves one request at a time; a request for a conversation that is busy starts a new
one. Idle sessions are dropped least recently used when their KV bytes exceed the memory limit
(or their count `max_sessions`); a dropped conversation's tokens are remembered, so its next
request counts as restarted (`reason="dropped"`) and its re-fed tokens as re-prefilled."""

from __future__ import annotations

import itertools
import threading
import time
from array import array
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvagent.errors import ConfigError
from kvagent.runtime import CacheConfig
from kvagent.serve.errors import RequestError
from kvagent.serve.kvconfig import request_spelling

TOMBSTONES = 256  # dropped conversations remembered (their token ids only)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix, compared in growing slices (C speed on long streams)."""
    n = min(len(a), len(b))
    lo, step = 0, 64
    while lo < n:
        hi = min(n, lo + step)
        if list(a[lo:hi]) != list(b[lo:hi]):
            return next(i for i in range(lo, hi) if a[i] != b[i])
        lo, step = hi, min(step * 2, 8192)
    return n


@dataclass(eq=False)
class Conversation:
    id: str
    session: Any  # kvagent.runtime.Session; touched only by the thread holding the lease
    config: CacheConfig
    first: int  # tokens of the first append: never rewound
    prefix: list[int]  # those tokens (to recognise the conversation while it is busy)
    reply_start: int = 0  # where the newest reply (and the generation prompt before it) begins
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = True
    kv_bytes: int = 0
    requests: int = 0


@dataclass
class Plan:
    """How one request uses a conversation."""

    conv: Conversation
    status: str  # "continued" | "new"
    reason: str  # continued: "continued"; new: "new" | "busy" | "dropped" | "diverged"
    keep: int = 0  # prompt tokens already in the session (not fed again)
    rewind: int = 0  # tokens taken back off the session's stream
    depth: str = "none"  # where the divergence was: "none" | "reply" | "deeper"
    reprefilled: int = 0  # prompt tokens this server had fed before for this conversation, fed again


class Conversations:
    def __init__(self, engine: Any, kv_memory: int | None = None, max_sessions: int = 1024) -> None:
        self.engine = engine
        self.kv_memory = kv_memory
        self.max_sessions = max_sessions
        self._lock = threading.Lock()
        self._live: dict[str, Conversation] = {}
        self._dropped: OrderedDict[str, tuple[CacheConfig, array, int]] = OrderedDict()
        self._ids = itertools.count(1)
        self.dropped = Counter()  # reason -> sessions dropped
        self.started = Counter()  # reason -> sessions started

    # ----------------------------------------------------------------- leases
    def lease(self, prompt: list[int], config: CacheConfig, first: int | None = None) -> Plan:
        """The conversation this prompt continues (rewind and keep set), or a new one whose first
        append will be `prompt[:first]` (default: all of it); either way held for this request
        until `release`."""
        with self._lock:
            plan = self._match(prompt, config)
            if plan.status == "continued":
                plan.conv.busy = True
                return plan
        try:
            session = self.engine.session(config)
        except ConfigError as e:
            raise RequestError(request_spelling(str(e))) from None
        first = len(prompt) if first is None else first
        conv = Conversation(f"s{next(self._ids)}", session, config, first, list(prompt[:first]))
        plan.conv = conv
        with self._lock:
            self._live[conv.id] = conv
            self.started[plan.reason] += 1
            self._trim(keep=conv)
        return plan

    def _match(self, prompt: list[int], config: CacheConfig) -> Plan:
        best, best_d, reason, known = None, -1, "new", 0
        for conv in self._live.values():
            if conv.config != config:
                continue
            if conv.busy:
                if len(prompt) > conv.first and prompt[: conv.first] == conv.prefix and reason == "new":
                    reason, known = "busy", conv.first
                continue
            d = common_prefix(prompt, conv.session.history)
            if d >= conv.first and d > best_d:
                best, best_d = conv, d
        if best is not None:
            history = best.session.history
            keep = min(best_d, len(prompt) - 1)  # the last prompt token is fed again for its logits
            if keep >= best.first:
                rewind = len(history) - keep
                depth = "none" if not rewind else "reply" if best_d >= best.reply_start else "deeper"
                return Plan(
                    best, "continued", "continued", keep, rewind, depth, min(len(history), len(prompt)) - keep
                )
            reason, known = "diverged", best_d
        for key, (cfg, tokens, first) in reversed(self._dropped.items()):
            if cfg == config and len(prompt) > first:
                d = common_prefix(prompt, tokens)
                if d >= first:
                    del self._dropped[key]
                    reason, known = "dropped", d
                    break
        return Plan(None, "new", reason, reprefilled=min(known, len(prompt)))  # type: ignore[arg-type]

    def release(self, conv: Conversation, kv_bytes: int) -> None:
        with self._lock:
            conv.busy = False
            conv.kv_bytes = kv_bytes
            conv.last_used = time.monotonic()
            conv.requests += 1
            self._trim(keep=conv)

    def discard(self, conv: Conversation) -> None:
        """Forget a conversation whose session failed mid-request (its state is not trusted)."""
        with self._lock:
            self._live.pop(conv.id, None)

    # ----------------------------------------------------------------- memory
    def _trim(self, keep: Conversation) -> None:
        """Drop idle sessions, least recently used first, while over the memory limit or count."""
        while True:
            over_count = len(self._live) > self.max_sessions
            over_bytes = self.kv_memory is not None and self._bytes() > self.kv_memory
            if not (over_count or over_bytes):
                return
            idle = [c for c in self._live.values() if not c.busy and c is not keep]
            if not idle:
                return
            victim = min(idle, key=lambda c: c.last_used)
            del self._live[victim.id]
            self.dropped["kv_memory" if over_bytes else "max_sessions"] += 1
            self._dropped[victim.id] = (victim.config, array("l", victim.session.history), victim.first)
            while len(self._dropped) > TOMBSTONES:
                self._dropped.popitem(last=False)

    def _bytes(self) -> int:
        return sum(c.kv_bytes for c in self._live.values())

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {
                "live": len(self._live),
                "busy": sum(c.busy for c in self._live.values()),
                "kv_bytes": self._bytes(),
            }

    def close(self) -> None:
        with self._lock:
            self._live.clear()
            self._dropped.clear()
