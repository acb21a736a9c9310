"""The one model forward: the chunks of one or more sessions (packed, no padding). A solo
session's forward is a batch of one; a batching engine's batcher joins many.

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

import threading
import warnings
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from kvagent.runtime.attention import ACTIVE_CACHE, attend_layer, attend_rows
from kvagent.runtime.cache import EvictableCache

# transformers >= 5.24 renamed `past_key_values` to `cache`; we keep the old name because the GPU
# image runs 5.17, which only knows `past_key_values`.
warnings.filterwarnings("ignore", message=r"`past_key_values` is deprecated", category=FutureWarning)


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
    first: int | None = None  # positions[0] as a host int (None: read it from the tensor)
    route: str | None = None  # how it ran: "static", or why eager (step.EAGER_REASONS)

    def __post_init__(self) -> None:
        if self.first is None:
            self.first = int(self.positions[0]) if len(self.ids) else 0

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
        chunks = self.owner.chunks
        if len(chunks) == 1:
            # A solo forward: the session's layer takes the chunk whole, and its live keys and
            # values go on to the attention (`PackedCache.attend`), as a plain cache's would.
            return chunks[0].cache.layers[self.layer_idx].update(key_states, value_states)
        li, sizes = self.layer_idx, self.owner.sizes
        # One split per tensor for all chunks (a slice per chunk costs a dispatch each).
        for c, k, v in zip(
            chunks, key_states.split(sizes, dim=2), value_states.split(sizes, dim=2), strict=True
        ):
            c.cache.layers[li].write(k, v)
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
    """Stands in for the caches of one forward's chunks. One per thread and layout, reused from
    forward to forward (`_packed_cache`): building its layers costs as much as a few layers' work."""

    def __init__(self, n_layers: int, backend: str) -> None:
        super().__init__(layers=[PackedLayer(self, i) for i in range(n_layers)])
        self.chunks: list[Chunk] = []
        self.sizes: list[int] = []  # tokens per chunk, in packed order
        self.runs_possible = False  # some decode chunk has a pool slot (so runs may form)
        self.recording = False  # some chunk's cache records queries
        self.backend = backend
        self.widest_run = 0  # most chunks one batched attention call served (for stats, tests)

    def begin(self, chunks: list[Chunk]) -> None:
        """Per-forward facts every layer would otherwise recompute."""
        self.chunks, self.widest_run = chunks, 0
        self.sizes = [len(c.ids) for c in chunks]
        self.runs_possible = sum(len(c.ids) == 1 and c.cache.slot is not None for c in chunks) > 1
        self.recording = any(c.cache.record for c in chunks)

    def record_queries(self, layer_idx: int, query: torch.Tensor) -> None:
        chunks = self.chunks
        if len(chunks) == 1:
            if chunks[0].cache.record:
                chunks[0].cache.record_queries(layer_idx, query)
            return
        if not self.recording:
            return
        for c, q in zip(chunks, query.split(self.sizes, dim=2), strict=True):
            if c.cache.record:
                # A view would pin the whole packed query for as long as the session keeps it.
                c.cache.record_queries(layer_idx, q.clone())

    def attend(self, layer_idx: int, query: torch.Tensor, key, value, scaling: float) -> torch.Tensor:
        """(1, T, H_q, D) attention output of every chunk, in packed order. `key`/`value` are what
        this layer's `update` returned: a solo session's live entries, else the packed chunk's."""
        if len(self.chunks) == 1:
            self.widest_run = max(self.widest_run, 1)
            layer = self.chunks[0].cache.layers[layer_idx]
            return attend_layer(layer, query, scaling, self.backend, key, value)
        backend = self.backend
        if not self.runs_possible:  # dense / private caches (or one slotted decode token): each alone
            self.widest_run = max(self.widest_run, 1)
            outs = [
                attend_layer(c.cache.layers[layer_idx], q, scaling, backend)
                for c, q in zip(self.chunks, query.split(self.sizes, dim=2), strict=True)
            ]
            return torch.cat(outs, dim=1)
        runs = _runs(self.chunks, layer_idx)
        self.widest_run = max(self.widest_run, max(len(r) for r in runs))
        outs = [
            _attend_run(run, layer_idx, query, scaling, backend)
            if len(run) > 1
            else _attend_alone(run[0], layer_idx, query, scaling, backend)
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
    return attend_layer(c.cache.layers[li], query[:, :, c.start : c.end], scaling, backend)


def _attend_run(run: list[Chunk], li: int, query, scaling, backend) -> torch.Tensor:
    first = run[0].cache.slot
    block, s0, b = first.block, first.index, len(run)
    lengths = [c.cache.layers[li].n for c in run]
    q = query[0, :, run[0].start : run[-1].end].transpose(0, 1)  # (b, H_q, D)
    # (b, H_kv, C, D) views of the block, no copy
    return attend_rows(
        q, block.keys[li][s0 : s0 + b], block.values[li][s0 : s0 + b], lengths, scaling, backend
    )


@torch.no_grad()
def run_forward(engine, chunks: list[Chunk]) -> int:
    """One forward over `chunks`; sets each chunk's float32 logits (every row or the last).
    Returns the most decode tokens one attention call served (the widest run). Decode tokens of
    sessions in one pool block take the static step (step.py) where the engine has one."""
    runner = getattr(engine, "step_runner", None)
    if runner is not None:
        plan, reason = runner.plan(chunks)
        if plan is not None:
            runner.run(chunks, plan)
            return len(chunks)
        runner.count_eager(reason, chunks)
    device = engine.device
    if len(chunks) == 1:  # a solo session: its positions as they are, a plain slice of logits
        c = chunks[0]
        c.start, ids = 0, c.ids
        c.cache.begin_forward(c.positions, c.first)
        position_ids, to_keep = c.positions.unsqueeze(0), 0 if c.all_logits else 1
    else:
        offset, ids, positions, keep = 0, [], [], []
        for c in chunks:
            c.start = offset
            offset += len(c.ids)
            ids.extend(c.ids)
            positions.append(c.positions)
            c.cache.begin_forward(c.positions, c.first)
            keep.extend(range(c.start, c.end) if c.all_logits else [c.end - 1])
        position_ids, to_keep = torch.cat(positions).unsqueeze(0), torch.tensor(keep, device=device)
    cache = _packed_cache(engine.n_layers, engine.backend)
    cache.begin(chunks)
    input_ids = torch.tensor([ids], device=device)
    try:
        if engine.model_path is not None:  # the one model path (decoder.py)
            logits = engine.model_path.forward(input_ids, position_ids, cache, to_keep)
        else:  # transformers' modules, attending through the hook (attention.py)
            token = ACTIVE_CACHE.set(cache)
            try:
                logits = engine.model(
                    input_ids=input_ids, position_ids=position_ids, past_key_values=cache,
                    use_cache=True, logits_to_keep=to_keep,
                ).logits  # fmt: skip
            finally:
                ACTIVE_CACHE.reset(token)
    finally:
        cache.chunks = []  # hold no session's cache past its forward
        cache.sizes = []
    logits = logits[0].float()
    row = 0
    for c in chunks:
        rows = len(c.ids) if c.all_logits else 1
        c.logits = logits[row : row + rows]
        row += rows
    return cache.widest_run


_THREAD = threading.local()


def _packed_cache(n_layers: int, backend: str) -> PackedCache:
    """This thread's PackedCache for the layout (a forward never runs inside another)."""
    caches = _THREAD.__dict__.setdefault("caches", {})
    key = (n_layers, backend)
    if key not in caches:
        caches[key] = PackedCache(n_layers, backend)
    return caches[key]
