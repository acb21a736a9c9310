"""The owner of a session's eviction state: its cache, the policy, per-layer policy state, per-layer
budgets, the round counter and the audit. It decides when a round is due, runs it, and drops the
positions `Session.forget` and `Session.rewind` name, all through one compaction routine, so the
cache and the per-entry policy state (H2O's accumulated attention) always change together.

The session tells it where the stream stands (its logical length and prompt length) at each call;
the evictor never reads the session.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable

import torch

from kvagent.errors import ConfigError
from kvagent.runtime.audit import AuditRound
from kvagent.runtime.cache import EvictableCache, keep_index
from kvagent.runtime.clock import RoundClock
from kvagent.runtime.config import SINK_TOKENS
from kvagent.runtime.heads import HeadLayer, select_adaptive
from kvagent.runtime.marks import SegmentMarks
from kvagent.runtime.plan import CachePlan
from kvagent.runtime.round import build_view, pad_state, round_generator, select
from kvagent.runtime.stats import CacheStats

# H2O-style policies fold their pending queries into state once this many have accumulated, so a
# dense reprefill of a long history does not hold every query of every layer at once.
ABSORB_EVERY = 1024


class DenseSnapshot:
    """What `Evictor.dense_snapshot` keeps. Never changed once made (`restore` copies out of it), so
    a copied session (the fact probe's greedy branch) shares it instead of copying the dense history."""

    def __init__(self, parts: tuple) -> None:
        self.parts = parts

    def __deepcopy__(self, memo) -> DenseSnapshot:
        return self


class Evictor:
    """Not thread-safe; owned by one session. `cache` is what the session's forwards write into."""

    def __init__(
        self,
        plan: CachePlan,
        stats: CacheStats,
        *,
        group_size: int,
        scaling: float,
        device: torch.device,
        slot=None,
    ) -> None:
        config = self.config = plan.config
        self.policy = plan.policy  # shared by the plan's sessions; its per-layer state is `state`
        self.schedule = plan.schedule  # each layer's K, when rounds are due
        self.stats = stats  # the session's counters; rounds and drops are counted here
        self.n_layers = plan.n_layers
        self.group_size = group_size
        self.scaling = scaling
        self.device = device  # rounds draw their random numbers here (round.round_generator)
        self.clock = RoundClock(device, stats)  # round seconds without a device sync (clock.py)
        self.slot = slot  # a pool Slot (batched engines), or None for a private cache
        # The slot goes back to its pool with this evictor (its session).
        self._slot_release = weakref.finalize(self, slot.release) if slot is not None else None
        self.adaptive = config.adaptive_heads
        self.segments = SegmentMarks()  # Session.mark_segment's positions (segment policies)
        self.audit: list[AuditRound] | None = [] if config.audit else None
        self.round_index = 0  # orders audit records: every round and every forced drop counts one
        self.reset()

    # ----------------------------------------------------------------- the cache
    def reset(self) -> None:
        """A fresh, empty cache and policy state (reprefill rebuilds from the history)."""
        c = self.config
        cache = EvictableCache(
            self.n_layers,
            window=c.window,
            record=c.evicts,
            keep_pending=c.evicts and self.policy.needs_pending_queries,
            # Reprefill's dense rebuild outgrows K + r; it moves into the slot once compressed.
            slot=self.slot if c.mode == "persistent" else None,
            layer_class=HeadLayer if self.adaptive else None,
        )
        for layer in cache.layers:
            layer.headroom = self.schedule.headroom  # HeadLayer: rows each head keeps free after a round
        if c.evicts and isinstance(c.budget, int):
            for layer, k in zip(cache.layers, self.layer_budgets(0), strict=True):
                layer.capacity_hint = self.schedule.trigger(k)
        self.cache = cache
        self.state: list[dict] = [{} for _ in range(self.n_layers)]  # per layer, the policy's

    def settle(self) -> None:
        """Between a session's forwards, move into a lower slot of the pool if one came free (vLLM
        condenses its persistent batch alike): live sessions stay together at the front, so their
        decode tokens keep forming one static batch (step.py takes one pool block at a time) of the
        smallest size, and a trailing block left empty gives its memory back. The numbers do not
        change."""
        old = self.slot
        new = old.pool.lower(old) if old is not None else None
        if new is None:
            return
        if self.cache.slot is old:  # else a reprefill rebuild not yet compressed into the slot
            self.cache.move_to(new)
        self.slot = new
        self._slot_release.detach()
        self._slot_release = weakref.finalize(self, new.release)
        old.release()

    def dense_snapshot(self) -> DenseSnapshot:
        """A copy of the cache and the per-layer policy state, taken inside a reprefill's dense
        rebuild (no round has run on it, so nothing else has changed since `reset`)."""
        return DenseSnapshot(copy.deepcopy((self.cache, self.state)))

    def restore(self, snapshot: DenseSnapshot) -> None:
        """`reset`, but to a copy of a `dense_snapshot` (which stays reusable)."""
        self.cache, self.state = copy.deepcopy(snapshot.parts)

    def kept_positions(self) -> list[torch.Tensor]:
        """Per layer (B, H_kv, N) positions held; -1 pads a head that holds fewer."""
        return [
            layer.live()[2].clone() if layer.is_initialized else torch.empty(0) for layer in self.cache.layers
        ]

    # ----------------------------------------------------------------- when rounds are due
    def layer_budgets(self, logical_length: int) -> list[int]:
        """Each layer's K at this logical length (fixed for a token budget)."""
        return self.schedule.layer_budgets(logical_length)

    def tokens_before_round(self, logical_length: int) -> int:
        """Tokens that can be fed before some layer reaches its trigger (<= 0: a round is due)."""
        if not self.config.evicts:  # the cache is never read
            return self.schedule.room(logical_length, [])
        return self.schedule.room(logical_length, self.cache.loads())

    def make_room(self, logical_length: int, prompt_length: int | None) -> int:
        """Run the rounds due before the next forward; returns how many tokens it may feed (>= 1)."""
        room = self.tokens_before_round(logical_length)
        # A rewind that took back every recorded query leaves a due round nothing to score with:
        # then one token is fed first (one entry over K + r, as scope prefill's decode is).
        if room <= 0 and self.cache.window_positions[0] is not None:
            self.evict_due(logical_length, prompt_length)
            room = self.tokens_before_round(logical_length)
        return max(room, 1)

    @torch.no_grad()
    def evict_due(self, logical_length: int, prompt_length: int | None, to_budget: bool = False) -> None:
        """Run a round on every layer that reached its trigger (K + 2r under recent-buffer, K + r
        under topk-all), or, with to_budget, holds more than a round leaves (K + r, or K); under
        cadence "shared", once one layer is due, on every layer holding more than a round leaves."""
        budgets = self.layer_budgets(logical_length)
        due = self.schedule.due(logical_length, self.cache.loads(), to_budget)
        if not due:
            return
        n_prot = self._n_protected(logical_length, prompt_length)
        for li in due:
            if n_prot >= budgets[li]:
                raise ConfigError(
                    f"budget: layer {li} keeps K={budgets[li]} but {n_prot} tokens are protected "
                    f"(protect={self.config.protect}); raise the budget or change protect"
                )
            self._evict_layer(li, budgets[li], logical_length, prompt_length)
        self.round_index += 1
        self.stats.rounds += 1

    def compress(self, logical_length: int, prompt_length: int | None) -> None:
        """Reprefill: cut every layer of the rebuilt cache to what a round leaves (K + r under
        recent-buffer, K under topk-all) at once, then move into the slot."""
        if self.config.evicts:
            self.evict_due(logical_length, prompt_length, to_budget=True)
        if self.slot is not None:
            self.cache.attach_slot(self.slot)

    @torch.no_grad()
    def absorb_pending(self, logical_length: int, prompt_length: int | None) -> None:
        """Fold long pending-query buffers into policy state (H2O), without evicting."""
        if not self.cache.keep_pending:
            return
        for li in range(self.n_layers):
            if self.cache.pending_count(li) >= ABSORB_EVERY:
                budget = self.layer_budgets(logical_length)[li]
                self.policy.absorb(self._view(li, budget, logical_length, prompt_length, pending=True))

    # ----------------------------------------------------------------- caller-chosen drops
    def forget(self, positions: list[int], logical_length: int, prompt_length: int | None) -> int:
        """Evict exactly `positions` from every layer and KV head now (protected ones too); returns
        how many distinct positions were held. Counted in stats.evicted and stats.forgotten."""
        if not positions:
            return 0
        wanted = torch.tensor(positions)
        gone, n_drop = self._drop(
            lambda live: torch.isin(live, wanted.to(live.device)), logical_length, prompt_length
        )
        self.stats.evicted += n_drop
        self.stats.forgotten += n_drop
        return len(gone)

    def rewind(self, cut: int, prompt_length: int | None) -> None:
        """Drop every entry of position >= cut, and the recorded queries of those positions (their
        tokens left the stream). Per-entry policy state keeps what those queries added to it."""
        self._drop(lambda live: live >= cut, cut, prompt_length)
        self.cache.drop_queries_from(cut)

    # ----------------------------------------------------------------- internals
    def _n_protected(self, logical_length: int, prompt_length: int | None) -> int:
        p = self.config.protect
        if p == "prompt":
            return prompt_length or 0
        if p == "sink":
            return min(SINK_TOKENS, logical_length)
        return 0

    def _view(self, li: int, budget: int, logical_length: int, prompt_length: int | None, pending: bool):
        return build_view(
            self.cache,
            self.cache.layers[li],
            n_layers=self.n_layers,
            group_size=self.group_size,
            scaling=self.scaling,
            budget=budget,
            n_protected=self._n_protected(logical_length, prompt_length),
            block=self.policy.block,
            recent_buffer=self.config.recent_buffer,
            generator=round_generator(self.config.seed, li, logical_length, self.device),
            state=self.state[li],
            segments=self.segments,
            pending=self.cache.take_pending(li) if pending else (None, None),
        )

    def _evict_layer(self, li: int, budget: int, logical_length: int, prompt_length: int | None) -> None:
        layer = self.cache.layers[li]
        self.clock.start()
        view = self._view(
            li, budget, logical_length, prompt_length, pending=self.policy.needs_pending_queries
        )
        keep = select_adaptive(self.policy, view) if self.adaptive else select(self.policy, view)
        self.clock.scored()
        before = layer.held()
        self._compact(li, keep, self.schedule.trigger(budget), pad=self.adaptive)
        self.clock.compacted()
        self.stats.evicted += before - layer.held()
        self._record(li, logical_length, prompt_length)

    def _compact(self, li: int, index: torch.Tensor, capacity: int, pad: bool) -> None:
        """The one compaction: keep entries `index` (B, H_kv, M) of layer `li` (-1 = PAD, with
        `pad`), and gather the policy's per-entry state with them."""
        layer = self.cache.layers[li]
        state = self.state[li]
        pad_state(state, layer.n)  # state of entries appended since the last round
        layer.compact(index, capacity, pad=pad)
        per_entry = state.get("per_entry", {})
        src = index.clamp(min=0)  # a head keeping fewer starts with -1 (PAD)
        for name, t in per_entry.items():
            per_entry[name] = t.expand(src.shape[0], src.shape[1], -1).gather(-1, src)

    def _drop(
        self, which: Callable[[torch.Tensor], torch.Tensor], logical_length: int, prompt_length: int | None
    ) -> tuple[set[int], int]:
        """Drop from every layer and KV head the entries `which(positions)` marks, now, like a
        round whose keep-set the caller chose (audited with `forced=True`). Heads that lose
        different counts leave the layer ragged (PAD entries, cache.py). Returns the distinct
        positions dropped and the (layer, head) entries dropped."""
        gone: set[int] = set()
        dropped = 0
        for li, layer in enumerate(self.cache.layers):
            if not layer.is_initialized or layer.n == 0:
                continue
            live = layer.live()[2]
            drop = which(live) & (live >= 0)
            n_drop = int(drop.sum().item())
            if not n_drop:
                continue
            gone.update(live[drop].unique().tolist())
            index = keep_index(live, drop)
            self._compact(li, index, max(layer.capacity_hint, index.shape[-1]), pad=True)
            dropped += n_drop
            self._record(li, logical_length, prompt_length, forced=True)
        if dropped:
            self.round_index += 1  # audit records stay ordered: this drop sits between two rounds
        return gone, dropped

    def _record(self, li: int, logical_length: int, prompt_length: int | None, forced: bool = False) -> None:
        if self.audit is None:
            return
        protect = self.config.protect == "prompt"
        self.audit.append(
            AuditRound(
                round=self.round_index,
                layer=li,
                logical_length=logical_length,
                prompt_length=(prompt_length or 0) if protect else 0,
                kept=self.cache.layers[li].live()[2][0].detach().cpu().clone(),
                forced=forced,
            )
        )
