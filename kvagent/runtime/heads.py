"""Ada-KV head budgets (`head_budget="adaptive"`): heads of a layer hold different counts.

Allocation (Feng et al. 2024, "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget
Allocation", arXiv:2407.11550): a layer's K x H_kv slots go to the top K x H_kv scores over all
its heads jointly, after a safeguard keeps each head's own top floor(alpha * K) (alpha = 0.2, as
kvpress's AdaKVPress). Protected entries are kept first, as always.

Layout: `HeadLayer` stores each KV head in its own buffer of (count_h + r) rows, so the memory
held is sum_h (count_h + r) rows, the uniform layout's H_kv x (K + r) in total, never padded to the
widest head; attention runs per KV head (its GQA group of query heads against that head's
entries). Rounds, forget and the oracle read `live()`, a temporary rectangular view whose shorter
heads start with PAD entries (position -1; see cache.py), so policies score it unchanged.
"""

from __future__ import annotations

import torch

from kvagent.runtime.cache import PAD, LayerBase, keep_index
from kvagent.runtime.policies.base import BasePolicy, LayerView

ALPHA_SAFEGUARD = 0.2


def check_adaptive(policy: BasePolicy, name: str) -> str | None:
    """Why `policy` cannot allocate head budgets adaptively (None if it can)."""
    if not policy.adaptive_heads:
        return (
            f"head_budget: adaptive needs attention scores comparable across heads, which {name} "
            "lacks; use snapkv, pyramidkv, h2o, tova or rkv, or --head-budget uniform"
        )
    if policy.shared_across_heads or policy.block > 1:
        return (
            f"head_budget: adaptive needs one keep-set per head, but {name} shares one per layer "
            "(tova: policy_args shared=false); or use --head-budget uniform"
        )
    return None


def select_adaptive(policy: BasePolicy, view: LayerView, alpha: float = ALPHA_SAFEGUARD) -> torch.Tensor:
    """(B, H_kv, M) index of the entries to keep, M = the most one head keeps; a head keeping
    fewer starts with -1 (PAD). The layer keeps K x H_kv entries in all (fewer if it holds fewer),
    plus every head's recent buffer (its view.recent_buffer newest entries, outside K)."""
    b, h, n = view.positions.shape
    big = torch.finfo(torch.float32).max
    real = view.positions >= 0
    buffered = view.recent_buffer_mask
    scores = policy.scores(view).to(torch.float32).expand(b, h, n).clamp(-big, big)
    k = view.budget
    n_safe = min(int(k * alpha), n)
    if n_safe > 0:
        # The safeguard: each head's own top floor(alpha * K) entries compete no further (among
        # its candidates: the recent buffer is kept anyway).
        top = scores.masked_fill(~real | buffered, float("-inf")).topk(n_safe, dim=-1).indices
        scores = scores.scatter(-1, top, big)
    scores = scores.masked_fill(view.protected | buffered, float("inf")).masked_fill(~real, float("-inf"))
    total = min((k + view.recent_buffer) * h, int(real[0].sum().item()))
    flat = scores.reshape(b, h * n).topk(total, dim=-1).indices
    keep = torch.zeros((b, h * n), dtype=torch.bool, device=scores.device)
    keep.scatter_(-1, flat, True)
    return keep_index(view.positions, ~keep.view(b, h, n))


class HeadLayer(LayerBase):
    """One layer with a buffer per KV head (batch size 1): keys/values (C_h, D), positions (C_h,)."""

    in_slot = False  # never in a pool: batched engines attend it alone
    ragged = True  # its live() view may carry PADs

    def __init__(self, owner, layer_idx: int) -> None:
        super().__init__()
        self.owner = owner
        self.layer_idx = layer_idx
        self.capacity_hint = 0
        self.headroom = 0  # r: rows kept free per head after a compaction
        self.counts: list[int] = []
        self.head_keys: list[torch.Tensor] = []
        self.head_values: list[torch.Tensor] = []
        self.head_positions: list[torch.Tensor] = []

    @property
    def n(self) -> int:
        return max(self.counts, default=0)

    def load(self) -> int:
        """Entries per head on average: what a round's trigger compares with K + r."""
        return -(-sum(self.counts) // max(1, len(self.counts)))

    def held(self) -> int:
        return sum(self.counts)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        if key_states.shape[0] != 1:
            raise ValueError("head_budget=adaptive caches hold one sequence (batch size 1)")
        h, d, dv = key_states.shape[1], key_states.shape[-1], value_states.shape[-1]
        cap = max(self.capacity_hint, key_states.shape[-2], 16)
        self.head_keys = [key_states.new_empty((cap, d)) for _ in range(h)]
        self.head_values = [value_states.new_empty((cap, dv)) for _ in range(h)]
        self.head_positions = [torch.empty(cap, dtype=torch.long, device=key_states.device) for _ in range(h)]
        self.counts = [0] * h
        self.keys, self.values = self.head_keys[0], self.head_values[0]  # for transformers' checks
        self.device = key_states.device
        self.is_initialized = True

    def _ensure(self, h: int, need: int) -> None:
        cap = self.head_keys[h].shape[0]
        if need <= cap:
            return
        c, new_cap = self.counts[h], max(need, 2 * cap)
        for store in (self.head_keys, self.head_values, self.head_positions):
            old = store[h]
            grown = old.new_empty((new_cap, *old.shape[1:]))
            grown[:c] = old[:c]
            store[h] = grown

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q = key_states.shape[-2]
        pos = self.owner.current_positions
        for h in range(len(self.counts)):
            c = self.counts[h]
            self._ensure(h, c + q)
            self.head_keys[h][c : c + q] = key_states[0, h]
            self.head_values[h][c : c + q] = value_states[0, h]
            self.head_positions[h][c : c + q] = pos
            self.counts[h] = c + q
        return key_states, value_states  # attention reads the heads' buffers (`head_entries`)

    @property
    def n_heads(self) -> int:
        return len(self.counts)

    def head_entries(self):
        """Each KV head's live (1, 1, count_h, D) keys and values, in head order (for attention)."""
        for h, c in enumerate(self.counts):
            yield (
                self.head_keys[h][:c].unsqueeze(0).unsqueeze(0),
                self.head_values[h][:c].unsqueeze(0).unsqueeze(0),
            )

    def live(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A rectangular (1, H_kv, M, ·) copy, each head right-aligned after PAD entries."""
        h, m = len(self.counts), self.n
        k0, v0 = self.head_keys[0], self.head_values[0]
        keys = k0.new_zeros((1, h, m, k0.shape[-1]))
        values = v0.new_zeros((1, h, m, v0.shape[-1]))
        positions = torch.full((1, h, m), PAD, dtype=torch.long, device=k0.device)
        for i, c in enumerate(self.counts):
            if c:
                keys[0, i, m - c :] = self.head_keys[i][:c]
                values[0, i, m - c :] = self.head_values[i][:c]
                positions[0, i, m - c :] = self.head_positions[i][:c]
        return keys, values, positions

    def compact(self, index: torch.Tensor, capacity: int, pad: bool = False) -> None:
        """Keep entries `index` (1, H_kv, M) of `live()` (-1 = none); each head gets count + r rows."""
        keys, values, positions = self.live()
        for h in range(len(self.counts)):
            idx = index[0, h]
            idx = idx[idx >= 0]
            idx = idx[positions[0, h, idx] >= 0]  # a PAD kept by a round is no entry
            c = idx.numel()
            cap = max(c + self.headroom, 1)
            for store, src in ((self.head_keys, keys), (self.head_values, values)):
                buf = src.new_empty((cap, src.shape[-1]))
                buf[:c] = src[0, h, idx]
                store[h] = buf
            buf = positions.new_empty(cap)
            buf[:c] = positions[0, h, idx]
            self.head_positions[h] = buf
            self.counts[h] = c

    def valid(self, length: int | None = None) -> torch.Tensor | None:
        return None  # attention goes through `head_entries`

    def attach_slot(self) -> None:
        pass

    def stores(self) -> tuple[torch.Tensor, ...]:
        return (*self.head_keys, *self.head_values, *self.head_positions)

    def reset(self) -> None:
        self.counts, self.head_keys, self.head_values, self.head_positions = [], [], [], []
        self.is_initialized = False
