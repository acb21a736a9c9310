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
one. Idle sessions past the memory limit (or their count `max_sessions`) leave memory least
recently used first: moved out whole (offload.py: host memory, then disk) where the server has
room there, and moved back when their conversation returns; else dropped. A dropped
conversation's tokens are remembered, so its next request counts as restarted
(`reason="dropped"`) and its re-fed tokens as re-prefilled."""

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
from kvagent.serve.offload import Offload, Stored

TOMBSTONES = 256  # dropped conversations remembered (their token ids only)
GONE = {  # why a request that must continue its session cannot, by the reason it would start anew
    "new": "no session on this server continues this conversation (never served here, lost in a restart "
    "without --session-dir, or its saved files could not be read)",
    "busy": "its session is serving another request",
    "diverged": "the prompt differs from its session inside the first turn",
}
CAUSES = {  # reason "dropped": the one thing that happened to its session
    "kv_memory": "its session was dropped for memory (past --kv-memory, with no room left in --swap-space or "
    "--session-dir)",
    "max_sessions": "its session was dropped for memory (past --max-sessions, with no room left in --swap-space "
    "or --session-dir)",
    "lost": "its session was lost (a server killed before it saved it)",
    "unreadable": "its saved session could not be read back (a damaged file, or one holding another "
    "conversation), and was moved to the session dir's unreadable/",
}


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
    moving: bool = False  # its session is being moved out of memory (busy until it is gone)
    stored: Stored | None = None  # where its session is coming back from (lease, before it is)


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
    restored: str = "none"  # continued: where its session came back from ("host" | "disk" | "none")
    tombstone: str | None = None  # new, reason dropped: the remembered conversation it restarts
    cause: str | None = None  # new, reason dropped: why its session is gone (a key of CAUSES)


class Conversations:
    def __init__(
        self,
        engine: Any,
        kv_memory: int | None = None,
        max_sessions: int = 1024,
        offload: Offload | None = None,
    ) -> None:
        self.engine = engine
        self.kv_memory = kv_memory
        self.max_sessions = max_sessions
        self.offload = offload  # where idle sessions go instead of being dropped (None: dropped)
        self._lock = threading.Lock()
        self._moved = threading.Condition(self._lock)  # a session finished moving out of memory
        self._live: dict[str, Conversation] = {}
        self._dropped: OrderedDict[str, tuple[CacheConfig, array, int, str]] = OrderedDict()
        # ids continue past every one a file in the session dir carries: never given twice
        self._ids = itertools.count((offload.last_id if offload else 0) + 1)
        self.dropped = Counter()  # reason -> sessions dropped
        self.started = Counter()  # reason -> sessions started
        # a killed server's conversations (markers without a session), and those whose session was
        # found unreadable (now, counted; or by an earlier server, remembered only): their next
        # request says so
        for gone in offload.set_aside_before if offload else []:
            self._tombstone(gone.id, gone.config, gone.history, gone.first, "unreadable", count=False)
        for cause in ("lost", "unreadable"):
            for gone in getattr(offload, cause) if offload else []:
                self._tombstone(gone.id, gone.config, gone.history, gone.first, cause)

    # ----------------------------------------------------------------- leases
    def lease(
        self,
        prompt: list[int],
        config: CacheConfig,
        first: int | None = None,
        require: bool = False,
        continues: bool = False,
    ) -> Plan:
        """The conversation this prompt continues (rewind and keep set), or a new one whose first
        append will be `prompt[:first]` (default: all of it); either way held for this request
        until `release`. With `require` (kv_require_session), a prompt that continues a
        conversation (`continues`: it holds an earlier reply; or one this server dropped) and
        finds no session to continue is refused with a 409 instead of re-prefilled."""
        while True:
            with self._lock:
                # its session on its way out of memory is not busy: wait until it is stored
                self._moved.wait_for(lambda: not self._moving(prompt, config))
                plan = self._match(prompt, config)
                if plan.status == "continued":
                    plan.conv.busy = True
                    if plan.conv.stored is None:
                        return plan
            if plan.status != "continued":
                break
            if self._bring_back(plan):  # a stored session, brought back outside the lock
                return plan
            # unreadable: its conversation is now remembered as dropped; match again
        if require and (continues or plan.reason != "new"):
            why = CAUSES[plan.cause] if plan.reason == "dropped" else GONE[plan.reason]
            raise RequestError(
                f"kv_require_session: {why}; send it without kv_require_session to start the "
                "conversation over (its history re-prefilled)",
                status=409,
                param="kv_require_session",
            )
        if plan.tombstone is not None:  # restarted: no longer remembered as dropped
            with self._lock:
                self._dropped.pop(plan.tombstone, None)
        try:
            session = self.engine.session(config)
        except ConfigError as e:
            raise RequestError(request_spelling(str(e))) from None
        first = len(prompt) if first is None else first
        conv = Conversation(f"s{next(self._ids)}", session, config, first, list(prompt[:first]))
        conv.kv_bytes = session.stats.total_kv_bytes  # a pool slot's slab is held from the start
        plan.conv = conv
        with self._lock:
            self._live[conv.id] = conv
            self.started[plan.reason] += 1
            victims = self._trim(keep=conv)
        if self.offload is not None:
            self.offload.mark(conv)
        self._move_out(victims)
        return plan

    def _bring_back(self, plan: Plan) -> bool:
        """The plan's stored session live again; False where it cannot be read back (another
        model's file, a damaged one, one of another conversation: set aside by the offload), its
        conversation then remembered as dropped, `unreadable`."""
        conv = plan.conv
        stored, conv.stored = conv.stored, None
        try:
            conv.session = self.offload.bring_back(stored)
            conv.kv_bytes = conv.session.stats.total_kv_bytes
        except (ConfigError, OSError):
            with self._lock:
                del self._live[conv.id]
                self._tombstone(stored.id, stored.config, stored.history, stored.first, "unreadable")
            return False
        with self._lock:
            victims = self._trim(keep=conv)
        self._move_out(victims)
        return True

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
        for stored in self.offload.stored() if self.offload else []:
            d = common_prefix(prompt, stored.history) if stored.config == config else -1
            if d >= stored.first and d > best_d:
                best, best_d = stored, d
        if isinstance(best, Stored) and min(best_d, len(prompt) - 1) < best.first:
            reason, known, best = "diverged", best_d, None
        elif isinstance(best, Stored):
            # it continues: live again (busy, session on its way) so no other request takes it
            self.offload.claim(best)
            s = best
            best = Conversation(s.id, None, s.config, s.first, list(s.history[: s.first]), s.reply_start,
                                requests=s.requests, stored=s)  # fmt: skip
            self._live[best.id] = best
        if best is not None:
            history = best.stored.history if best.stored is not None else best.session.history
            keep = min(best_d, len(prompt) - 1)  # the last prompt token is fed again for its logits
            if keep >= best.first:
                rewind = len(history) - keep
                depth = "none" if not rewind else "reply" if best_d >= best.reply_start else "deeper"
                where = best.stored.where if best.stored is not None else "none"
                return Plan(
                    best, "continued", "continued", keep, rewind, depth, min(len(history), len(prompt)) - keep,
                    restored=where,
                )  # fmt: skip
            reason, known = "diverged", best_d
        tombstone = cause = None
        for key, (cfg, tokens, first, why) in reversed(self._dropped.items()):
            if cfg == config and len(prompt) > first:
                d = common_prefix(prompt, tokens)
                if d >= first:
                    reason, known, tombstone, cause = "dropped", d, key, why
                    break
        return Plan(
            None, "new", reason, reprefilled=min(known, len(prompt)), tombstone=tombstone, cause=cause
        )  # type: ignore[arg-type]

    def release(self, conv: Conversation, kv_bytes: int) -> None:
        with self._lock:
            conv.busy = False
            conv.kv_bytes = kv_bytes
            conv.last_used = time.monotonic()
            conv.requests += 1
            victims = self._trim(keep=conv)
        self._move_out(victims)

    def discard(self, conv: Conversation) -> None:
        """Forget a conversation whose session failed mid-request (its state is not trusted)."""
        with self._lock:
            self._live.pop(conv.id, None)

    # ----------------------------------------------------------------- memory
    def _trim(self, keep: Conversation) -> list[tuple[Conversation, str]]:
        """Idle sessions, least recently used first, while over the memory limit or count: dropped
        here without an offload, else marked moving and returned (the caller moves them out of the
        lock, `_move_out`), with the reason."""
        victims = []
        while True:
            staying = [c for c in self._live.values() if not c.moving]
            over_count = len(staying) > self.max_sessions
            over_bytes = self.kv_memory is not None and self._bytes() > self.kv_memory
            if not (over_count or over_bytes):
                return victims
            idle = [c for c in staying if not c.busy and c is not keep]
            if not idle:
                return victims
            victim = min(idle, key=lambda c: c.last_used)
            reason = "kv_memory" if over_bytes else "max_sessions"
            if self.offload is None:
                del self._live[victim.id]
                self._tombstone(
                    victim.id, victim.config, array("l", victim.session.history), victim.first, reason
                )
            else:
                victim.busy = victim.moving = True
                victims.append((victim, reason))

    def _move_out(self, victims: list[tuple[Conversation, str]]) -> None:
        for victim, reason in victims:
            stored, lost = None, []
            try:
                stored, lost = self.offload.move_out(victim)
            finally:  # stored, or dropped (counted), in one step: a waiting request finds it either way
                with self._lock:
                    del self._live[victim.id]
                    if stored is None:
                        history = array("l", victim.session.history)
                        self._tombstone(victim.id, victim.config, history, victim.first, reason)
                    for s in lost:
                        self._tombstone(s.id, s.config, s.history, s.first, reason)
                    self._moved.notify_all()

    def _moving(self, prompt: list[int], config: CacheConfig) -> bool:
        """Is a session that may continue this prompt being moved out of memory right now?"""
        return any(
            c.moving and c.config == config and len(prompt) > c.first and prompt[: c.first] == c.prefix
            for c in self._live.values()
        )

    def _tombstone(
        self, cid: str, config: CacheConfig, history: array, first: int, reason: str, count: bool = True
    ) -> None:
        """Count a dropped session and remember its tokens and why (its next request says `dropped`,
        its 409 the cause)."""
        self.dropped[reason] += count
        self._dropped[cid] = (config, history, first, reason)
        while len(self._dropped) > TOMBSTONES:
            self._dropped.popitem(last=False)

    def _bytes(self) -> int:
        return sum(c.kv_bytes for c in self._live.values() if not c.moving)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {
                "live": len(self._live),
                "busy": sum(c.busy for c in self._live.values()),
                "kv_bytes": self._bytes(),
                **(self.offload.snapshot() if self.offload else {}),
            }

    def close(self) -> None:
        """Forget every session; with a session dir, save each (idle by now) for the next server."""
        with self._lock:
            if self.offload is not None:
                self.offload.save_all(
                    [c for c in self._live.values() if c.session is not None and not c.busy]
                )
            self._live.clear()
            self._dropped.clear()
