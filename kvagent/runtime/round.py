"""One eviction round on one layer: view -> policy scores -> protection -> top-K -> compaction.

The policy only scores; everything that makes eviction correct lives here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvagent.runtime.cache import EvictableCache, EvictableLayer
from kvagent.runtime.policies.base import BasePolicy, LayerView

_SEED_MIX = (1_000_003, 10_007)


def round_generator(seed: int, layer_idx: int, logical_length: int, device=None) -> torch.Generator:
    """A generator that depends only on (seed, layer, logical length), not on the path that led
    here, so reprefill's cache is a function of the token history alone. On the cache's device, so
    a policy's draws need no host copy (a CUDA generator draws other numbers than a CPU one: keep-sets
    are reproducible per device, not across devices)."""
    g = torch.Generator(device=device) if device is not None else torch.Generator()
    g.manual_seed((seed * _SEED_MIX[0] + layer_idx * _SEED_MIX[1] + logical_length) % (2**63 - 1))
    return g


def block_partition(n: int, n_protected: int, block: int, device, recent_buffer: int = 0) -> torch.Tensor:
    """(N,) block id per entry, -1 for protected entries and for the `recent_buffer` newest (never
    candidates). Blocks are aligned to the newest candidate so the most recent block is whole; the
    oldest candidate block may be short."""
    ids = torch.full((n,), -1, dtype=torch.long, device=device)
    m = n - n_protected - recent_buffer
    if m <= 0:
        return ids
    n_blocks = -(-m // block)
    # distance from the newest candidate, in blocks, mapped so block 0 is the oldest
    offset = torch.arange(m - 1, -1, -1, device=device) // block
    ids[n_protected : n_protected + m] = (n_blocks - 1) - offset
    return ids


def pad_state(state: dict, n: int) -> None:
    """Zero-pad per-entry policy state for entries appended since the last round."""
    per_entry = state.get("per_entry", {})
    for name, t in per_entry.items():
        if t.shape[-1] < n:
            per_entry[name] = F.pad(t, (0, n - t.shape[-1]))


def build_view(
    cache: EvictableCache,
    layer: EvictableLayer,
    *,
    n_layers: int,
    group_size: int,
    scaling: float,
    budget: int,
    n_protected: int,
    block: int,
    generator: torch.Generator,
    state: dict,
    pending: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None),
    recent_buffer: int = 0,
    segments: list[int] | None = None,
) -> LayerView:
    keys, values, positions = layer.live()
    n = keys.shape[-2]
    # Protected = the first n_protected logical positions, by position rather than by index: a
    # forgotten one is gone, and a ragged head starts with PAD entries (position -1).
    protected = (positions >= 0) & (positions < n_protected)
    pad_state(state, n)
    recent_buffer = min(recent_buffer, n)
    if block > 1:  # protected entries are the oldest, so the partition counts them from the front
        n_protected = int(protected[0, 0].sum().item())
        # an entry both protected and in the recent buffer counts once
        recent_buffer = min(recent_buffer, n - n_protected)
    li = layer.layer_idx
    return LayerView(
        keys=keys,
        values=values,
        positions=positions,
        queries=cache.window_queries[li],
        query_positions=cache.window_positions[li],
        layer_idx=li,
        n_layers=n_layers,
        group_size=group_size,
        scaling=scaling,
        generator=generator,
        budget=budget,
        protected=protected,
        recent_buffer=recent_buffer,
        block_ids=block_partition(n, n_protected, block, keys.device, recent_buffer) if block > 1 else None,
        pending_queries=pending[0],
        pending_positions=pending[1],
        state=state,
        segment_starts=torch.tensor(segments, dtype=torch.long, device=keys.device) if segments else None,
    )


def select(policy: BasePolicy, view: LayerView) -> torch.Tensor:
    """Indices (B, H_kv, M) of the entries to keep, ascending along M (so position order holds):
    the protected ones and the top K - protected of the candidates, plus the recent buffer."""
    b, h, n = view.positions.shape
    scores = policy.scores(view).to(torch.float32)
    if scores.shape[1] == 1:
        scores = scores.expand(b, h, n)
    # A policy's own +inf (a forced keep) must still rank below protection, or protected entries
    # could lose a tie when forced + protected exceed K.
    big = torch.finfo(torch.float32).max
    scores = scores.clamp(max=big).masked_fill(view.protected, float("inf"))
    if view.recent_buffer:  # kept outside K, like protection: a policy's score never reaches them
        scores = scores.masked_fill(view.recent_buffer_mask, float("inf"))
    if view.block_ids is None:
        # PAD entries (cache.py) lose to every real entry, even one the policy scored -inf; a
        # head holding fewer than K real entries keeps some PADs (they stay at its front).
        scores = scores.clamp(min=-big).masked_fill(view.positions < 0, float("-inf"))
        k = min(view.budget + view.recent_buffer, n)
        idx = scores.topk(k, dim=-1, sorted=False).indices
        return idx.sort(dim=-1).values
    return _select_blocks(scores, view)


def _select_blocks(scores: torch.Tensor, view: LayerView) -> torch.Tensor:
    b, h, n = scores.shape
    ids = view.block_ids
    fixed = ids < 0
    n_blocks = int(ids.max().item()) + 1 if (~fixed).any() else 0
    keep = fixed.expand(b, h, n).clone()
    if n_blocks:
        cand = ~fixed
        bid = ids[cand]
        sizes = torch.bincount(bid, minlength=n_blocks)
        sums = torch.zeros((b, h, n_blocks), device=scores.device)
        cand_scores = scores[:, :, cand]
        # +inf (forced keep) must stay +inf through the mean: clamp before summing, flag separately.
        forced = torch.zeros((b, h, n_blocks), device=scores.device)
        src = torch.isposinf(cand_scores).float()
        forced = forced.scatter_reduce_(2, bid.expand(b, h, -1), src, "amax") > 0
        sums.index_add_(2, bid, torch.nan_to_num(cand_scores, posinf=0.0, neginf=-1e30))
        block_score = (sums / sizes).masked_fill(forced, float("inf"))
        # the recent buffer is outside K
        slots = view.budget + view.recent_buffer - int(fixed.sum().item())
        order = block_score.argsort(dim=-1, descending=True)
        fits = sizes[order].cumsum(-1) <= slots
        chosen = torch.zeros((b, h, n_blocks), dtype=torch.bool, device=scores.device)
        chosen.scatter_(2, order, fits)
        full_ids = ids.clamp(min=0).expand(b, h, n)
        keep |= chosen.gather(2, full_ids) & ~fixed
    counts = keep.sum(-1)
    if not bool((counts == counts.flatten()[0]).all()):
        raise RuntimeError(
            "block selection kept different counts per head; blocks must be equal-sized per head"
        )
    m = int(counts.flatten()[0].item())
    # Stable sort of ~keep puts kept entries first, in position order.
    return (~keep).to(torch.int8).argsort(dim=-1, stable=True)[..., :m]
