"""One model forward over the pending chunks of many sessions (packed, no padding).

The chunks are concatenated into one `(1, T)` row: every linear layer runs over exactly the tokens
fed, and each token carries its own session's logical position, so RoPE needs no batch dimension.
A `PackedCache` stands in for the sessions' caches: its `update` writes each chunk's new K/V into
that session's own cache, `record_queries` hands each session its own queries, and `attend`
computes attention per session: consecutive decode tokens whose sessions hold consecutive slots of
one pool block (lengths within r) form a run served by one masked SDPA over a view of the block;
everything else (prefill chunks, dense or private caches) is attended alone, exactly as a solo
forward would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache, CacheLayerMixin

from kvagent.runtime.attention import ACTIVE_CACHE, _flash, _sdpa, flash_available
from kvagent.runtime.cache import EvictableCache


@dataclass
class Chunk:
    """One session's tokens in a packed forward."""

    cache: EvictableCache
    ids: list[int]
    positions: torch.Tensor  # (q,) logical positions
    all_logits: bool
    start: int = 0  # offset in the packed row
    logits: torch.Tensor | None = None
    error: BaseException | None = None
    extra: dict = field(default_factory=dict)

    @property
    def end(self) -> int:
        return self.start + len(self.ids)


class PackedLayer(CacheLayerMixin):
    is_sliding = False

    def __init__(self, owner: PackedCache, layer_idx: int) -> None:
        super().__init__()
        self.owner, self.layer_idx = owner, layer_idx
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:  # never lazy
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        for c in self.owner.chunks:
            c.cache.layers[self.layer_idx].update(
                key_states[:, :, c.start : c.end], value_states[:, :, c.start : c.end]
            )
        # The attention reads each session's own storage (`PackedCache.attend`), not these.
        return key_states, value_states

    def get_mask_sizes(self, query_length: int, *args, **kwargs) -> tuple[int, int]:
        return query_length, 0

    def get_seq_length(self) -> int:
        return 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        pass


class PackedCache(Cache):
    packed = True

    def __init__(self, n_layers: int, chunks: list[Chunk], backend: str) -> None:
        super().__init__(layers=[PackedLayer(self, i) for i in range(n_layers)])
        self.chunks = chunks
        self.backend = backend
        self.widest_run = 0  # most chunks one batched attention call served (for stats, tests)

    def record_queries(self, layer_idx: int, query: torch.Tensor) -> None:
        single = len(self.chunks) == 1
        for c in self.chunks:
            if c.cache.record:
                q = query[:, :, c.start : c.end]
                # A view would pin the whole packed query for as long as the session keeps it.
                c.cache.record_queries(layer_idx, q if single else q.clone())

    def attend(self, layer_idx: int, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """(1, T, H_q, D) attention output of every chunk, in packed order."""
        runs = _runs(self.chunks, layer_idx)
        self.widest_run = max(self.widest_run, max(len(r) for r in runs))
        outs = [
            _attend_run(run, layer_idx, query, scaling, self.backend)
            if len(run) > 1
            else _attend_alone(run[0], layer_idx, query, scaling, self.backend)
            for run in runs
        ]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


def _runs(chunks: list[Chunk], li: int) -> list[list[Chunk]]:
    """Group consecutive decode chunks that sit in consecutive slots of one pool block and whose
    lengths stay within the pool's r of each other (so padding never exceeds r)."""
    runs: list[list[Chunk]] = []
    for c in chunks:
        if runs and _joins(runs[-1], c, li):
            runs[-1].append(c)
        else:
            runs.append([c])
    return runs


def _batchable(c: Chunk, li: int) -> bool:
    layer = c.cache.layers[li]
    return len(c.ids) == 1 and layer.in_slot and not layer.ragged


def _joins(run: list[Chunk], c: Chunk, li: int) -> bool:
    last = run[-1]
    if not (_batchable(c, li) and _batchable(last, li)):
        return False
    a, b = last.cache.slot, c.cache.slot
    if a.pool is not b.pool or a.block_index != b.block_index or b.index != a.index + 1:
        return False
    lengths = [x.cache.layers[li].n for x in run] + [c.cache.layers[li].n]
    return max(lengths) - min(lengths) <= b.pool.buffer


def _attend_alone(c: Chunk, li: int, query, scaling, backend) -> torch.Tensor:
    layer = c.cache.layers[li]
    q = query[:, :, c.start : c.end]
    if hasattr(layer, "attend"):  # head_budget=adaptive (heads.py)
        return layer.attend(q, scaling, backend)
    keys, values, _ = layer.live()
    valid = layer.valid()
    if valid is None and backend == "flash" and q.is_cuda:
        return _flash(q, keys, values, scaling)
    return _sdpa(q, keys, values, scaling, valid)


def _attend_run(run: list[Chunk], li: int, query, scaling, backend) -> torch.Tensor:
    first = run[0].cache.slot
    block, s0, b = first.block, first.index, len(run)
    lengths = [c.cache.layers[li].n for c in run]
    n_max = max(lengths)
    keys = block.keys[li][s0 : s0 + b]  # (b, H_kv, C, D): a view, no copy
    values = block.values[li][s0 : s0 + b]
    h_q, h_kv = query.shape[1], keys.shape[1]
    q = query[0, :, run[0].start : run[-1].end].transpose(0, 1)  # (b, H_q, D)
    if backend == "flash" and q.is_cuda and flash_available():
        from flash_attn import flash_attn_with_kvcache

        out = flash_attn_with_kvcache(
            q.unsqueeze(1),
            keys.transpose(1, 2),
            values.transpose(1, 2),
            cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device=q.device),
            softmax_scale=scaling,
            causal=False,
        )  # (b, 1, H_q, D)
        return out.transpose(0, 1)
    # One token per row: the query heads sharing a kv head become that head's query rows, so SDPA
    # needs no GQA expansion; a per-row key-length mask hides each row's padding.
    qg = q.reshape(b, h_kv, h_q // h_kv, q.shape[-1])
    mask = None
    if min(lengths) != n_max:
        n = torch.tensor(lengths, device=q.device)
        mask = (torch.arange(n_max, device=q.device) < n[:, None]).view(b, 1, 1, n_max)
    out = F.scaled_dot_product_attention(
        qg, keys[:, :, :n_max], values[:, :, :n_max], attn_mask=mask, scale=scaling
    )
    return out.reshape(1, b, h_q, out.shape[-1])


@torch.no_grad()
def run_packed(engine, chunks: list[Chunk]) -> PackedCache:
    """One forward over `chunks`; sets each chunk's float32 logits (every row or the last)."""
    offset, ids, positions, keep = 0, [], [], []
    for c in chunks:
        c.start = offset
        offset += len(c.ids)
        ids.extend(c.ids)
        positions.append(c.positions)
        c.cache.current_positions = c.positions
        keep.extend(range(c.start, c.end) if c.all_logits else [c.end - 1])
    device = engine.device
    cache = PackedCache(engine.n_layers, chunks, engine.backend)
    token = ACTIVE_CACHE.set(cache)
    try:
        out = engine.model(
            input_ids=torch.tensor([ids], device=device),
            position_ids=torch.cat(positions).unsqueeze(0),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=torch.tensor(keep, device=device),
        )
    finally:
        ACTIVE_CACHE.reset(token)
    logits = out.logits[0].float()
    row = 0
    for c in chunks:
        rows = len(c.ids) if c.all_logits else 1
        c.logits = logits[row : row + rows]
        row += rows
    return cache
