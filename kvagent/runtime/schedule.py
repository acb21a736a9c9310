"""When a session's eviction rounds come: the one object that the evictor asks while it runs and
every check before a run (a command's budget refusal, eval's grid check, fidelity's eligibility,
the demo's, through `budget.check_run`; a served request's at its session's first append) asks.

Built from a CacheConfig, the policy and the model's layer count, it owns:
- each layer's K (`layer_budgets`): the policy's split of the budget, where a fractional budget is
  that fraction of the logical length (`tokens`, the one place that rule lives);
- what a round leaves (`leaves`: K + the recent buffer, so K + r under recent-buffer, K under
  topk-all) and the trigger (`trigger`: what a round leaves + r, so K + 2r or K + r): a layer's
  round runs when it holds that many entries; under cadence "shared" every layer holding more than
  a round leaves cuts too once one is due (`due`);
- the room left before a round (`room`), and when the first round comes (`first_round`)."""

from __future__ import annotations

import math
from typing import Any

from kvagent.runtime.config import CacheConfig, build_policy

_SEARCH_LIMIT = 1 << 26  # logical tokens; no first round below it = none that matters
NO_ROUND = 1 << 62  # the room of a cache that never evicts


class Schedule:
    """Built once per configuration (`plan.CachePlan`) and shared by its sessions: its only state
    is a cache of each K's split, whose entries never change once written."""

    def __init__(self, config: CacheConfig, policy: Any, n_layers: int) -> None:
        """`policy`: the config's (its split of K, its block); None where only the trigger is asked
        (`beyond_k`, `leaves`, `trigger`: a status line, a record whose policy has left the registry)."""
        self.config = config
        self.policy = policy
        self.n_layers = n_layers
        self._split: dict[int, list[int]] = {}

    @classmethod
    def of(cls, config: CacheConfig, n_layers: int, policy: Any = None) -> Schedule:
        """A schedule for a check made before a session exists (`policy`: built from `config` if None)."""
        return cls(config, build_policy(config) if policy is None else policy, n_layers)

    # ----------------------------------------------------------------- K
    def tokens(self, logical_length: int) -> int:
        """The budget in tokens at this logical length: a token budget as it is, a fraction of the
        logical length at least 1."""
        b = self.config.budget
        return b if isinstance(b, int) else max(1, int(b * logical_length))

    def layer_budgets(self, logical_length: int) -> list[int]:
        """Each layer's K at this logical length (fixed for a token budget)."""
        k = self.tokens(logical_length)
        if k not in self._split:
            split = [int(x) for x in self.policy.layer_budgets(k, self.n_layers)]
            if len(split) != self.n_layers:
                raise RuntimeError(
                    f"{self.config.policy}.layer_budgets returned {len(split)} budgets for {self.n_layers} layers"
                )
            self._split[k] = split
        return self._split[k]

    # ----------------------------------------------------------------- the trigger
    @property
    def recent_buffer(self) -> int:
        """What a round leaves beyond K: the recent buffer (r under recent-buffer, else 0)."""
        return self.config.recent_buffer

    @property
    def headroom(self) -> int:
        """Entries a layer takes beyond what a round leaves before its next round: r."""
        return self.config.buffer

    @property
    def beyond_k(self) -> int:
        """Entries a layer holds past its K at the trigger: 2r under recent-buffer, r under topk-all
        (a cap shown as `K+2r`)."""
        return self.trigger(0)

    def leaves(self, k: int) -> int:
        """What a round leaves a layer of this K: K + the recent buffer (K + r under recent-buffer,
        K under topk-all); a reprefill's rebuild is cut to it at once."""
        return k + self.recent_buffer

    def trigger(self, k: int) -> int:
        """The most entries a layer of this K holds: its round runs when it holds this many (K + 2r
        under recent-buffer, K + r under topk-all), and a layer's buffers are sized to it."""
        return self.leaves(k) + self.headroom

    def capacities(self) -> tuple[int, ...] | None:
        """Each layer's most entries (its trigger) when fixed for the session's life (an evicting
        cache with a token budget and uniform heads): the slot pool it can live in on a batching
        engine. None otherwise (dense, fractional or adaptive caches stay private)."""
        c = self.config
        if not c.evicts or not isinstance(c.budget, int) or c.adaptive_heads:
            return None
        return tuple(self.trigger(k) for k in self.layer_budgets(0))

    def room(self, logical_length: int, loads: list[int]) -> int:
        """Tokens that can be fed before some layer holding `loads` reaches its trigger (<= 0: a
        round is due)."""
        if not self.config.evicts:
            return NO_ROUND
        room = min(
            self.trigger(k) - n for k, n in zip(self.layer_budgets(logical_length), loads, strict=True)
        )
        b = self.config.budget
        if isinstance(b, float) and room > 0:
            # K grows with the episode for a fractional budget; stretch the chunk so it still ends
            # exactly at the trigger instead of creeping towards it in ever smaller chunks.
            room = math.ceil(room / (1.0 - b))
        return room

    def due(self, logical_length: int, loads: list[int], to_budget: bool = False) -> list[int]:
        """The layers whose round runs now: those at their trigger or, with `to_budget` (a
        reprefill's rebuild), every one holding more than a round leaves; under cadence "shared",
        once one is due, every layer holding more than a round leaves, so all stay in one phase."""
        budgets = self.layer_budgets(logical_length)
        r = 0 if to_budget else self.headroom
        over = [li for li, (k, n) in enumerate(zip(budgets, loads, strict=True)) if n > self.leaves(k)]
        due = [li for li in over if loads[li] >= self.leaves(budgets[li]) + r]
        if due and self.config.cadence == "shared":
            return over
        return due

    # ----------------------------------------------------------------- before the episode
    def first_round(self, prompt_length: int, layer: int) -> int | None:
        """The logical length at which `layer` first evicts, where it can be known before the
        episode (None: no round, or one whose timing depends on the episode)."""
        c = self.config
        b = c.budget
        if c.mode == "reprefill":
            # Every append rebuilds the cache and cuts it to what a round leaves at once.
            if prompt_length > self.leaves(self.layer_budgets(prompt_length)[layer]):
                return prompt_length
            if not isinstance(b, int):
                return None
        shared = c.cadence == "shared"
        if isinstance(b, int):
            ks = self.layer_budgets(0)
            # shared: the first layer's trigger, or later if this layer does not yet hold more than K + r
            return (
                max(self.trigger(min(ks)), self.leaves(ks[layer]) + 1) if shared else self.trigger(ks[layer])
            )

        # A fraction: the first length that reaches K(L) + r (+ r), by bisection (L - K(L) grows with L).
        def due(n: int) -> bool:
            ks = self.layer_budgets(n)
            if shared:
                return n > self.leaves(ks[layer]) and n >= self.trigger(min(ks))
            return n >= self.trigger(ks[layer])

        if not due(_SEARCH_LIMIT):
            return None
        lo, hi = 1, _SEARCH_LIMIT
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if due(mid) else (mid + 1, hi)
        # With scope=prefill, decoding never evicts: past the prompt, the round waits for the next append.
        return lo if c.scope == "prefill+decode" or lo <= prompt_length else None
