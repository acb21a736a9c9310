"""A Session: one episode's token stream over one live, evictable KV cache.

The session keeps the stream (history, prompt length, the last logits), runs its forwards and
dispatches forget / rewind by mode; its `Evictor` (evictor.py) owns the cache and everything that
decides what the cache keeps. Persistent mode keeps the cache across turns and evicts
irreversibly whenever a layer reaches its trigger (K + 2r entries under the recent-buffer
framework, K + r under topk-all; prefill is chunked so it never holds more). Reprefill mode
re-prefills the whole token history densely at every `append` and compresses once to what a round
leaves (K + r, or K) with that turn's window. With `reuse_prefix` on, a rebuild starts from a copy
of the previous rebuild's dense state at its last whole chunk instead of position 0.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from kvagent.errors import ConfigError
from kvagent.runtime.batcher import in_call
from kvagent.runtime.budget import check_prompt_fits
from kvagent.runtime.cache import EvictableCache
from kvagent.runtime.config import Sampling
from kvagent.runtime.evictor import DenseSnapshot, Evictor
from kvagent.runtime.forward import Chunk
from kvagent.runtime.generation import Generation, Stopping, generate_tokens
from kvagent.runtime.plan import CachePlan
from kvagent.runtime.stats import CacheStats


class SessionEngine(Protocol):
    """What a session uses of its engine (engine.py's `Engine`, which makes sessions; named here
    so that this module need not import engine.py back)."""

    model: Any
    tokenizer: Any
    device: torch.device
    batcher: Any  # batcher.Batcher on a batching engine, else None
    eos_token_ids: set[int]
    model_facts: dict
    n_layers: int
    group_size: int
    scaling: float
    max_context: int | None

    def forward(self, chunk: Chunk) -> None: ...

    def slot_for(self, capacities: tuple[int, ...] | None, buffer: int, window: int) -> Any: ...


class Session:
    """One episode. Not thread-safe; run one session per thread (on an engine with max_batch > 1,
    sessions in different threads share forwards).

    `tracer`, when set, sees every forward and rewind: `tracer.forwarded(start, ids, kept_before,
    logits)` and `tracer.rewound(logical_length)` (the oracle's `trace` uses it)."""

    def __init__(self, engine: SessionEngine, plan: CachePlan) -> None:
        """`plan`: the engine's prepared plan of the session's config (`Engine.plan`)."""
        self.engine = engine
        self.config = config = plan.config
        self.history: list[int] = []
        self.prompt_length: int | None = None
        self._stats = CacheStats()
        self._last_logits: torch.Tensor | None = None
        self._sample_gen: torch.Generator | None = None
        self._stale = False  # reprefill: forget/rewind changed the history; the next forward rebuilds
        self.tracer = None
        # Reprefill replays (bench fidelity): keep a copy of each dense rebuild at its last whole
        # chunk, so the next rebuild runs only from there. Off by default: it holds the dense
        # history beside the budgeted cache, and a rebuild's cost is what `bench speed` measures.
        self.reuse_prefix = False
        self._prefix: tuple[list[int], DenseSnapshot] | None = None  # (the tokens it holds, their state)
        # The static slab of a pool this session's cache lives in (evicting, token budget; else private).
        slot = engine.slot_for(plan.schedule.capacities(), config.buffer, config.window)
        self.evictor = Evictor(
            plan,
            self._stats,
            group_size=engine.group_size,
            scaling=engine.scaling,
            device=engine.device,
            slot=slot,
        )

    # ----------------------------------------------------------------- public API
    @property
    def logical_length(self) -> int:
        return len(self.history)

    @property
    def policy(self):
        return self.evictor.policy

    @property
    def cache(self) -> EvictableCache:
        """The live cache (the evictor's; reprefill replaces it at every append)."""
        return self.evictor.cache

    @property
    def audit(self) -> list | None:
        """AuditRound records (audit.py) of every round and forced drop, if config.audit."""
        return self.evictor.audit

    @property
    def last_logits(self) -> torch.Tensor | None:
        """float32 logits of the newest token fed (None before the first append and after a
        rewind, until the next feed)."""
        return self._last_logits

    @property
    def stats(self) -> CacheStats:
        s = self._stats
        self.evictor.clock.settle()  # round seconds still in flight on a GPU (clock.py)
        s.logical_length = self.logical_length
        s.entries = self.cache.entries()
        s.kv_bytes = [layer.nbytes() for layer in self.cache.layers]
        return s

    def kept_positions(self) -> list[torch.Tensor]:
        """Per layer (B, H_kv, N) positions held; -1 pads a head that holds fewer (after forget)."""
        return self.evictor.kept_positions()

    def save(self, path) -> int:
        """Write all that decides what this session does next to `path`, atomically (persist.py);
        `Engine.load_session(path)` continues it exactly. Returns the bytes written."""
        from kvagent.runtime import persist

        return persist.save(self, path)

    @in_call
    def append(self, ids, all_logits: bool = False) -> torch.Tensor:
        """Prefill a chunk of token ids; returns float32 logits of its last token (or of every
        token with `all_logits=True`)."""
        ids = _as_list(ids)
        if not ids:
            raise ConfigError("append: got no token ids; pass at least one")
        self.evictor.settle()
        if self.prompt_length is None:
            self.prompt_length = len(ids)
            check_prompt_fits(self.evictor.schedule, self.prompt_length)
        if self.config.mode == "reprefill" and (self.config.evicts or self._stale):
            return self._reprefill(ids, all_logits)
        return self._prefill(ids, evict=self.config.evicts, all_logits=all_logits)

    @in_call
    def step(self, token_id: int) -> torch.Tensor:
        """Feed one token through the decode path; returns float32 logits (vocab,)."""
        self.evictor.settle()
        if self._stale:
            return self._reprefill([int(token_id)], all_logits=False)
        logits = self._forward([int(token_id)], all_logits=False)
        self._stats.decode_tokens += 1
        if self.config.evicts and self.config.scope == "prefill+decode":
            self.evictor.evict_due(self.logical_length, self.prompt_length)
        return logits[-1]

    @in_call
    def teacher_force(self, ids) -> torch.Tensor:
        """Feed tokens exactly as that many `step` calls would (same logits, same rounds at the same
        points, same keep-sets; never a reprefill), in batched forwards. Returns (n, vocab) logits,
        row i predicting the token after ids[i]. For replaying recorded assistant turns."""
        ids = _as_list(ids)
        if not ids:
            raise ConfigError("teacher_force: got no token ids; pass at least one")
        if self._last_logits is None:
            raise ConfigError(f"teacher_force: {self._no_logits()}")
        self.evictor.settle()
        if self._stale:
            return self._reprefill(ids, all_logits=True)
        evict = self.config.evicts and self.config.scope == "prefill+decode"
        return self._prefill(ids, evict=evict, all_logits=True, decode=True)

    @in_call
    def generate(
        self,
        max_new_tokens: int,
        sampling: Sampling | None = None,
        stop=None,
        on_token=None,
        *,
        seed: int | None = None,
        stopping: Stopping | None = None,
        on_text=None,
    ) -> Generation:
        """Sample up to `max_new_tokens` with `step` (fewer if the model's context ends first); every
        sampled id (the last too) is fed. `stop`: stop strings (added to `stopping.stop`);
        `stopping`: stop ids, min_tokens, ignore_eos and what the text keeps (generation.Stopping).
        `seed`: this reply draws from a generator of its own seeded so (the same seed on the same
        stream gives the same reply; a server's per-request seed); without it, the session's
        generator continues (seeded at the first sampled reply from sampling.seed, else the
        config's). `on_token(id)`, if given, sees each id once it is fed; a true return ends the
        reply there (finish_reason "interrupted", unless it ended anyway): chat streams and stops
        replies so. `on_text(text)` sees the reply's text so far whenever more of it is safe to show
        (never a partial character, never the start of a stop string)."""
        if self._last_logits is None:
            raise ConfigError(f"generate: {self._no_logits()}")
        if self._stale:
            raise ConfigError("generate: forget() changed this reprefill session's history; append first")
        sampling = sampling or Sampling()
        stopping = stopping or Stopping()
        if stop:
            stopping = dataclasses.replace(stopping, stop=[*stopping.stop, *stop])
        if seed is not None:
            generator = torch.Generator().manual_seed(seed)
        else:
            if self._sample_gen is None:
                first = sampling.seed if sampling.seed is not None else self.config.seed
                self._sample_gen = torch.Generator().manual_seed(first)
            generator = self._sample_gen
        e = self.engine
        if e.max_context is not None:
            max_new_tokens = min(max_new_tokens, max(0, e.max_context - self.logical_length))
        return generate_tokens(
            self.step,
            self._last_logits,
            max_new_tokens,
            sampling,
            generator,
            e.tokenizer,
            e.eos_token_ids,
            stopping,
            on_token,
            on_text,
        )

    def forget(self, positions: Sequence[int]) -> int:
        """Drop these logical positions (ints in [0, logical_length)) from the session, e.g. an
        earlier turn's <think> block. Persistent mode: evicted now from every layer and KV head
        that holds them, protected or not; the rest keep their positions, logical_length and
        history are unchanged. Reprefill mode: removed from the history (later tokens shift
        down), which the next append (or step) re-prefills. Returns the number of distinct
        positions removed: held by some (layer, head), or taken out of the history.
        stats.forgotten counts the (layer, head) entries dropped. Logits already returned are
        not recomputed."""
        drop = _fed_positions(positions, self.logical_length)
        if self.config.mode == "persistent":
            return self.evictor.forget(drop, self.logical_length, self.prompt_length)
        if drop:
            gone = set(drop)
            self.history = [t for i, t in enumerate(self.history) if i not in gone]
            if self.prompt_length is not None:
                self.prompt_length -= sum(1 for p in drop if p < self.prompt_length)
            self.evictor.segments.forget(drop)
            self._stale = True
        return len(drop)

    def mark_segment(self, position: int) -> None:
        """A segment (a tool output, a reply) starts at logical `position`: segment-aware policies
        (policies/segments.py) keep or evict whole segments; forget and rewind move marks (marks.py)."""
        self.evictor.segments.add(int(position))

    @property
    def segment_starts(self) -> tuple[int, ...]:
        return tuple(self.evictor.segments)

    def rewind(self, n: int) -> int:
        """Take back the newest `n` tokens, so the next `append` continues at position
        logical_length - n with no gap (e.g. a client re-rendered the newest reply differently).
        n is in [0, logical_length - prompt_length]: never into the first append. Persistent
        mode: every layer and KV head drops its entries of those positions now, through the
        evictor's exact drop (entries evicted before stay evicted; audited with `forced=True`),
        and their recorded window / pending queries go too; per-entry policy state cannot un-see
        them (H2O's accumulated attention keeps what the dropped queries added). Reprefill mode:
        the history is cut and the next append re-prefills. Either way the last logits are gone:
        generate and teacher_force need an append (or step) first. Counted in stats.rewound.
        Returns n."""
        if isinstance(n, bool) or not isinstance(n, int):
            raise ConfigError(f"rewind: n must be an int, got {n!r}")
        top = self.logical_length - (self.prompt_length or 0)
        if not 0 <= n <= top:
            raise ConfigError(
                f"rewind: n={n} is outside [0, {top}]; rewind at most the tokens fed after the first append"
            )
        if n == 0:
            return 0
        cut = self.logical_length - n
        self.history = self.history[:cut]
        self.evictor.segments.cut(cut)
        self._last_logits = None
        self._stats.rewound += n
        if self.config.mode == "reprefill":
            self._stale = True
        else:
            self.evictor.rewind(cut, self.prompt_length)
        if self.tracer is not None:
            self.tracer.rewound(cut)
        return n

    # ----------------------------------------------------------------- internals
    def _no_logits(self) -> str:
        """Why there are no last logits to continue from, and what to do."""
        if self.logical_length:
            return "rewind() took back the last token's logits; append the tokens that replace them first"
        return "the session is empty; append a prompt first"

    def _prefill(self, ids: list[int], evict: bool, all_logits: bool, decode: bool = False) -> torch.Tensor:
        ev = self.evictor
        chunks = []
        i = 0
        while i < len(ids):
            size = self.config.prefill_chunk
            if evict:
                size = min(size, ev.make_room(self.logical_length, self.prompt_length))
            logits = self._forward(ids[i : i + size], all_logits=all_logits)
            fed = min(size, len(ids) - i)
            if decode:
                self._stats.decode_tokens += fed
            else:
                self._stats.prefill_tokens += fed
            chunks.append(logits)
            i += size
            if evict:
                ev.evict_due(self.logical_length, self.prompt_length)
        return torch.cat(chunks) if all_logits else chunks[-1][-1]

    def _reprefill(self, ids: list[int], all_logits: bool) -> torch.Tensor:
        full = self.history + ids
        start = self._restore_prefix(full, len(self.history))
        self.history = full[:start]
        parts = []
        # The same chunks from 0 as a rebuild without reuse (bit-identical forwards), split where
        # the last whole chunk ends so the state there can be kept for the next rebuild.
        cut = len(full) // self.config.prefill_chunk * self.config.prefill_chunk
        if self.reuse_prefix and cut > start:
            parts.append(self._prefill(full[start:cut], evict=False, all_logits=all_logits))
            self._prefix = (full[:cut], self.evictor.dense_snapshot())
            start = cut
        if start < len(full):
            parts.append(self._prefill(full[start:], evict=False, all_logits=all_logits))
        logits = torch.cat(parts) if all_logits else parts[-1]
        self._stale = False
        self.evictor.compress(self.logical_length, self.prompt_length)
        if all_logits:
            return logits[-len(ids) :]
        return logits

    def _restore_prefix(self, full: list[int], old_length: int) -> int:
        """Reset the evictor for a rebuild of `full`; from the kept dense prefix where it still
        is one (forget or rewind may have changed the history) and holds no token fed now.
        Returns the tokens restored."""
        if self.reuse_prefix and self._prefix is not None:
            tokens, snapshot = self._prefix
            if len(tokens) <= old_length and full[: len(tokens)] == tokens:
                self.evictor.restore(snapshot)
                self._stats.reused_tokens += len(tokens)
                return len(tokens)
        self.evictor.reset()
        return 0

    def _forward(self, ids: list[int], all_logits: bool) -> torch.Tensor:
        start = self.logical_length
        cache = self.cache
        tracer = self.tracer
        kept = self.kept_positions() if tracer is not None else None
        chunk = Chunk(
            cache,
            ids,
            torch.arange(start, start + len(ids), device=self.engine.device),
            all_logits,
            first=start,
        )
        t0 = time.perf_counter()
        self.engine.forward(chunk)
        self._stats.forward_s += time.perf_counter() - t0
        if chunk.route is not None:  # "static", or why it ran eager (step.EAGER_REASONS)
            self._stats.forwards[chunk.route] = self._stats.forwards.get(chunk.route, 0) + 1
        self._stats.peak_entries = max(self._stats.peak_entries, *cache.entries())
        logits = chunk.logits
        self.history.extend(ids)
        self._last_logits = logits[-1]
        if cache.keep_pending:
            self.evictor.absorb_pending(self.logical_length, self.prompt_length)
        if tracer is not None:
            tracer.forwarded(start, ids, kept, logits)
        return logits


def _fed_positions(positions: Sequence[int], logical_length: int) -> list[int]:
    """Sorted distinct positions, each an int in [0, logical_length)."""
    if isinstance(positions, torch.Tensor):
        positions = positions.flatten().tolist()
    out = set()
    for p in positions:
        if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < logical_length:
            raise ConfigError(
                f"forget: position {p!r} is not a fed token; pass ints in [0, {logical_length})"
            )
        out.add(p)
    return sorted(out)


def _as_list(ids) -> list[int]:
    if isinstance(ids, torch.Tensor):
        return [int(x) for x in ids.flatten().tolist()]
    return [int(x) for x in ids]
