"""A Session: one episode over one live, evictable KV cache.

Persistent mode keeps the cache across turns and evicts irreversibly whenever a layer reaches
K + r entries (prefill is chunked so it never holds more). Reprefill mode re-prefills the whole
token history densely at every `append` and compresses once to K with that turn's window.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from kvagent.errors import ConfigError
from kvagent.runtime.attention import ACTIVE_CACHE
from kvagent.runtime.audit import record
from kvagent.runtime.cache import EvictableCache
from kvagent.runtime.config import SINK_TOKENS, CacheConfig, Sampling
from kvagent.runtime.eviction import build_view, round_generator, select
from kvagent.runtime.generation import Generation, generate_tokens
from kvagent.runtime.heads import HeadLayer, select_adaptive
from kvagent.runtime.policies import make_policy
from kvagent.runtime.policies.base import model_defaults
from kvagent.runtime.scheduler import scheduled
from kvagent.runtime.stats import CacheStats

if TYPE_CHECKING:
    from kvagent.runtime.engine import Engine

# transformers >= 5.24 renamed `past_key_values` to `cache`; we keep the old name because the GPU
# image runs 5.17, which only knows `past_key_values`.
warnings.filterwarnings("ignore", message=r"`past_key_values` is deprecated", category=FutureWarning)

# H2O-style policies fold their pending queries into state once this many have accumulated, so a
# dense reprefill of a long history does not hold every query of every layer at once.
ABSORB_EVERY = 1024


class Session:
    """One episode. Not thread-safe; run one session per thread (on an engine with max_batch > 1,
    sessions in different threads share forwards)."""

    def __init__(self, engine: Engine, config: CacheConfig) -> None:
        self.engine = engine
        self.config = config
        facts = model_defaults(config.policy, engine.model_facts, config.policy_args)
        self.policy = make_policy(config.policy, **facts, **config.policy_args)
        self.n_layers = engine.n_layers
        self.history: list[int] = []
        self.prompt_length: int | None = None
        self._stats = CacheStats()
        self.audit = [] if config.audit else None
        self._round = 0
        self._last_logits: torch.Tensor | None = None
        self._sample_gen: torch.Generator | None = None
        self._budgets_cache: dict[int, list[int]] = {}
        self._stale = False  # reprefill: forget() changed the history; the next forward rebuilds
        self._adaptive = config.evicts and config.head_budget == "adaptive"
        self._validate()
        # Batched engines: this session's rows in a slot pool (adaptive heads: private buffers).
        self._slot = None if self._adaptive else engine.slot_for(self)
        self.cache = self._new_cache()

    # ----------------------------------------------------------------- public API
    @property
    def logical_length(self) -> int:
        return len(self.history)

    @property
    def stats(self) -> CacheStats:
        s = self._stats
        s.logical_length = self.logical_length
        s.entries = self.cache.entries()
        s.kv_bytes = [layer.nbytes() for layer in self.cache.layers]
        return s

    def kept_positions(self) -> list[torch.Tensor]:
        """Per layer (B, H_kv, N) positions held; -1 pads a head that holds fewer (after forget)."""
        return [
            layer.live()[2].clone() if layer.is_initialized else torch.empty(0) for layer in self.cache.layers
        ]

    @scheduled
    def append(self, ids, all_logits: bool = False) -> torch.Tensor:
        """Prefill a chunk of token ids; returns float32 logits of its last token (or of every
        token with `all_logits=True`)."""
        ids = _as_list(ids)
        if not ids:
            raise ConfigError("append: got no token ids; pass at least one")
        if self.prompt_length is None:
            self.prompt_length = len(ids)
            self._check_prompt_fits()
        if self.config.mode == "reprefill" and (self.config.evicts or self._stale):
            return self._reprefill(ids, all_logits)
        return self._prefill(ids, evict=self.config.evicts, all_logits=all_logits)

    @scheduled
    def step(self, token_id: int) -> torch.Tensor:
        """Feed one token through the decode path; returns float32 logits (vocab,)."""
        if self._stale:
            return self._reprefill([int(token_id)], all_logits=False)
        logits = self._forward([int(token_id)], all_logits=False)
        self._stats.decode_tokens += 1
        if self.config.evicts and self.config.scope == "prefill+decode":
            self._evict_due()
        return logits[-1]

    @scheduled
    def teacher_force(self, ids) -> torch.Tensor:
        """Feed tokens exactly as that many `step` calls would (same logits, same rounds at the same
        points, same keep-sets; never a reprefill), in batched forwards. Returns (n, vocab) logits,
        row i predicting the token after ids[i]. For replaying recorded assistant turns."""
        ids = _as_list(ids)
        if not ids:
            raise ConfigError("teacher_force: got no token ids; pass at least one")
        if self._last_logits is None:
            raise ConfigError(f"teacher_force: {self._no_logits()}")
        if self._stale:
            return self._reprefill(ids, all_logits=True)
        evict = self.config.evicts and self.config.scope == "prefill+decode"
        return self._prefill(ids, evict=evict, all_logits=True, decode=True)

    @scheduled
    def generate(
        self, max_new_tokens: int, sampling: Sampling | None = None, stop=None, on_token=None
    ) -> Generation:
        """Sample up to `max_new_tokens` with `step`; every sampled id (the last too) is fed.
        `on_token(id)`, if given, sees each id once it is fed; a true return ends the reply there
        (finish_reason "interrupted", unless it ended anyway): chat streams and stops replies so."""
        return generate_tokens(self, max_new_tokens, sampling or Sampling(), stop, on_token)

    def forget(self, positions: Sequence[int]) -> int:
        """Drop these logical positions (ints in [0, logical_length)) from the session, e.g. an
        earlier turn's <think> block. Persistent mode: evicted now from every layer and KV head
        that holds them, protected or not; the rest keep their positions, logical_length and
        history are unchanged. Reprefill mode: removed from the history (later tokens shift
        down), which the next append (or step) re-prefills. Returns the number of distinct
        positions removed: held by some (layer, head), or taken out of the history.
        stats.forgotten counts the (layer, head) entries dropped. Logits already returned are
        not recomputed."""
        from kvagent.runtime.forget import check_positions, forget_history, forget_persistent

        drop = check_positions(positions, self.logical_length)
        if self.config.mode == "reprefill":
            return forget_history(self, drop)
        return forget_persistent(self, drop)

    def rewind(self, n: int) -> int:
        """Take back the newest `n` tokens, so the next `append` continues at position
        logical_length - n with no gap (e.g. a client re-rendered the newest reply differently).
        n is in [0, logical_length - prompt_length]: never into the first append. Persistent
        mode: every layer and KV head drops its entries of those positions now, through forget's
        exact drop (entries evicted before stay evicted; audited with `forced=True`), and their
        recorded window / pending queries go too; per-entry policy state cannot un-see them
        (H2O's accumulated attention keeps what the dropped queries added). Reprefill mode: the
        history is cut and the next append re-prefills. Either way the last logits are gone:
        generate and teacher_force need an append (or step) first. Counted in stats.rewound.
        Returns n."""
        from kvagent.runtime.forget import rewind

        return rewind(self, n)

    # ----------------------------------------------------------------- internals
    def _validate(self) -> None:
        c = self.config
        if not c.evicts:
            return
        ctx = self.engine.max_context
        if isinstance(c.budget, int) and ctx and c.budget > ctx:
            raise ConfigError(
                f"budget: {c.budget} exceeds the model's context limit {ctx}; use a budget <= {ctx}"
            )
        block = self.policy.block
        if block > 1 and isinstance(c.budget, int) and c.budget % block:
            lo, hi = (c.budget // block) * block, (c.budget // block + 1) * block
            raise ConfigError(
                f"budget: {c.budget} is not a multiple of {c.policy}'s block {block}; use {lo or hi} or {hi}"
            )

    def _no_logits(self) -> str:
        """Why there are no last logits to continue from, and what to do."""
        if self.logical_length:
            return "rewind() took back the last token's logits; append the tokens that replace them first"
        return "the session is empty; append a prompt first"

    def _check_prompt_fits(self) -> None:
        from kvagent.runtime.budget import check_prompt_fits

        check_prompt_fits(self.config, self.prompt_length, self.n_layers, self.policy)

    def _new_cache(self) -> EvictableCache:
        c = self.config
        cache = EvictableCache(
            self.n_layers,
            window=c.window,
            record=c.evicts,
            keep_pending=c.evicts and self.policy.needs_pending_queries,
            backend=self.engine.backend,
            # Reprefill's dense rebuild outgrows K + r; it moves into the slot once compressed.
            slot=self._slot if c.mode == "persistent" else None,
            layer_class=HeadLayer if self._adaptive else None,
        )
        for layer in cache.layers:
            layer.headroom = c.buffer  # HeadLayer: rows each head keeps free after a round
        if c.evicts and isinstance(c.budget, int):
            for layer, k in zip(cache.layers, self._layer_budgets(0), strict=True):
                layer.capacity_hint = k + c.buffer
        self._state = [{} for _ in range(self.n_layers)]
        return cache

    def _layer_budgets(self, logical_length: int) -> list[int]:
        b = self.config.budget
        k = b if isinstance(b, int) else max(1, int(b * logical_length))
        if k not in self._budgets_cache:
            budgets = self.policy.layer_budgets(k, self.n_layers)
            if len(budgets) != self.n_layers:
                raise RuntimeError(f"{self.config.policy}.layer_budgets returned {len(budgets)} budgets")
            self._budgets_cache[k] = [int(x) for x in budgets]
        return self._budgets_cache[k]

    def _n_protected(self) -> int:
        p = self.config.protect
        if p == "prompt":
            return self.prompt_length or 0
        if p == "sink":
            return min(SINK_TOKENS, self.logical_length)
        return 0

    def _room(self) -> int:
        """Tokens that can be fed before some layer reaches K + r."""
        if not self.config.evicts:
            return 1 << 62
        budgets = self._layer_budgets(self.logical_length)
        r = self.config.buffer
        room = min(k + r - n for k, n in zip(budgets, self.cache.loads(), strict=True))
        b = self.config.budget
        if isinstance(b, float) and room > 0:
            # K grows with the episode for a fractional budget; stretch the chunk so it still ends
            # exactly at the trigger instead of creeping towards it in ever smaller chunks.
            room = math.ceil(room / (1.0 - b))
        return room

    def _prefill(self, ids: list[int], evict: bool, all_logits: bool, decode: bool = False) -> torch.Tensor:
        chunks = []
        i = 0
        while i < len(ids):
            size = self.config.prefill_chunk
            if evict:
                room = self._room()
                if room <= 0 and self.cache.window_positions[0] is not None:
                    self._evict_due()
                    continue
                # A rewind that took back every recorded query leaves a due round nothing to score
                # with: feed one token first (one entry over K + r, as scope prefill's decode is).
                size = min(size, max(room, 1))
            logits = self._forward(ids[i : i + size], all_logits=all_logits)
            fed = min(size, len(ids) - i)
            if decode:
                self._stats.decode_tokens += fed
            else:
                self._stats.prefill_tokens += fed
            chunks.append(logits)
            i += size
            if evict:
                self._evict_due()
        return torch.cat(chunks) if all_logits else chunks[-1][-1]

    def _reprefill(self, ids: list[int], all_logits: bool) -> torch.Tensor:
        full = self.history + ids
        self.history = []
        self.cache = self._new_cache()
        logits = self._prefill(full, evict=False, all_logits=all_logits)
        self._stale = False
        if self.config.evicts:
            self._evict_due(to_budget=True)
        if self._slot is not None:
            self.cache.attach_slot(self._slot)
        if all_logits:
            return logits[-len(ids) :]
        return logits

    @torch.no_grad()
    def _forward(self, ids: list[int], all_logits: bool) -> torch.Tensor:
        engine = self.engine
        start = self.logical_length
        positions = torch.arange(start, start + len(ids), device=engine.device)
        t0 = time.perf_counter()
        if engine.scheduler is not None:  # shared with other sessions' pending forwards
            logits = engine.scheduler.forward(self.cache, ids, positions, all_logits)
        else:
            self.cache.current_positions = positions
            token = ACTIVE_CACHE.set(self.cache)
            try:
                out = engine.model(
                    input_ids=torch.tensor([ids], device=engine.device),
                    position_ids=positions.unsqueeze(0),
                    past_key_values=self.cache,
                    use_cache=True,
                    logits_to_keep=0 if all_logits else 1,
                )
            finally:
                ACTIVE_CACHE.reset(token)
            logits = out.logits[0].float()
        self._stats.forward_s += time.perf_counter() - t0
        self.history.extend(ids)
        self._last_logits = logits[-1]
        if self.cache.keep_pending:
            self._absorb_pending()
        return logits

    def _absorb_pending(self) -> None:
        for li in range(self.n_layers):
            if self.cache.pending_count(li) >= ABSORB_EVERY:
                view = self._view(li, self._layer_budgets(self.logical_length)[li], pending=True)
                self.policy.absorb(view)

    def _view(self, li: int, budget: int, pending: bool):
        e = self.engine
        return build_view(
            self.cache,
            self.cache.layers[li],
            n_layers=self.n_layers,
            group_size=e.group_size,
            scaling=e.scaling,
            budget=budget,
            n_protected=self._n_protected(),
            block=self.policy.block,
            generator=round_generator(self.config.seed, li, self.logical_length),
            state=self._state[li],
            pending=self.cache.take_pending(li) if pending else (None, None),
        )

    @torch.no_grad()
    def _evict_due(self, to_budget: bool = False) -> None:
        """Run a round on every layer that reached K + r (or, with to_budget, exceeds K)."""
        budgets = self._layer_budgets(self.logical_length)
        r = 0 if to_budget else self.config.buffer
        due = [
            li
            for li, (k, n) in enumerate(zip(budgets, self.cache.loads(), strict=True))
            if n >= k + r and n > k
        ]
        if not due:
            return
        n_prot = self._n_protected()
        for li in due:
            if n_prot >= budgets[li]:
                raise ConfigError(
                    f"budget: layer {li} keeps K={budgets[li]} but {n_prot} tokens are protected "
                    f"(protect={self.config.protect}); raise the budget or change protect"
                )
            self._evict_layer(li, budgets[li])
        self._round += 1
        self._stats.rounds += 1

    def _evict_layer(self, li: int, budget: int) -> None:
        layer = self.cache.layers[li]
        sync = self.engine.device.type == "cuda"
        t0 = time.perf_counter()
        view = self._view(li, budget, pending=self.policy.needs_pending_queries)
        keep = select_adaptive(self.policy, view) if self._adaptive else select(self.policy, view)
        if sync:
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        before = layer.held()
        layer.compact(keep, budget + self.config.buffer, pad=self._adaptive)
        per_entry = self._state[li].get("per_entry", {})
        src = keep.clamp(min=0)  # adaptive keep-sets start with -1 (PAD) in shorter heads
        for name, t in per_entry.items():
            per_entry[name] = t.expand(src.shape[0], src.shape[1], -1).gather(-1, src)
        if sync:
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        st = self._stats
        st.scoring_s += t1 - t0
        st.compaction_s += t2 - t1
        st.evicted += before - layer.held()
        record(self, li)


def _as_list(ids) -> list[int]:
    if isinstance(ids, torch.Tensor):
        return [int(x) for x in ids.flatten().tolist()]
    return [int(x) for x in ids]
