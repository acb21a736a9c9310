"""Slot pools: the static slabs every evicting session with a token budget keeps its KV in.

A pool serves sessions whose layers have the same capacities C_l (K_l + 2r, or K_l + r under
topk-all). Per layer it holds `(S, H_kv, W_l, D)` key/value slabs and `(S, H_kv, W_l)` positions,
W_l the capacity plus a scratch column rounded up to the static attention's chunk unit
(`attention_step.slab_width`), in blocks of `block_slots` slots (the engine's max_batch; 1 on a solo
engine); a session
owns one slot (the same index in every layer) and compacts in place, so its storage never moves
inside a call. Between its calls a session moves into the lowest free slot if it is lower than its
own (`lower`, `Evictor.settle`): sessions that came and went leave live ones scattered over
blocks, and the static step takes one block at a time. Past a slot's live entries every
position is -1 (PAD): the static decode step (step.py) attends a slot's whole slab under the
mask `positions >= 0`, with no length in its shapes. Column C_l of every slot is
scratch: the static step's rows that carry no session write there, at position -1, so nothing
ever attends it; the padding past it is never written. Batched eager attention reads `keys[s0:s1, :, :n_max]` of
one block, a view, for sessions holding consecutive slots. Blocks are never reallocated while a
slot of theirs is held, so a compaction in one thread can never race a growth in another; a new
block is added when every slot is taken, and trailing blocks whose slots are all free give their
memory back.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from kvagent.runtime.attention_step import slab_width


@dataclass(eq=False)
class SlotBlock:
    keys: list[torch.Tensor]  # per layer (S, H_kv, W_l, D), W_l = attention_step.slab_width(C_l)
    values: list[torch.Tensor]
    positions: list[torch.Tensor]  # per layer (S, H_kv, W_l)
    ring: torch.Tensor | None = None  # (S, L, H_q, W + 1, D): each slot's window queries (cache.py)
    # The static step's batches over this block, by (runner, B) (step.py): they and their CUDA
    # graphs hold the slabs, so they live and die with the block.
    batches: dict = field(default_factory=dict, repr=False)


@dataclass(frozen=True, eq=False)
class Slot:
    pool: SlotPool
    block_index: int
    index: int

    @property
    def block(self) -> SlotBlock:
        return self.pool.blocks[self.block_index]

    def release(self) -> None:
        """Give the slot back to its pool (its session is gone)."""
        self.pool.release(self)

    def views(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This slot's (1, H_kv, C_l, D) key/value and (1, H_kv, C_l) position views of one layer
        (the scratch column left out)."""
        i, b, c = self.index, self.block, self.pool.capacities[layer_idx]
        return (
            b.keys[layer_idx][i : i + 1, :, :c],
            b.values[layer_idx][i : i + 1, :, :c],
            b.positions[layer_idx][i : i + 1, :, :c],
        )

    def ring(self) -> torch.Tensor | None:
        """This slot's (L, H_q, W + 1, D) window-query ring (None: the pool keeps none)."""
        ring = self.block.ring
        return None if ring is None else ring[self.index]

    def __deepcopy__(self, memo):
        # A copied session (the fact probe's branch) owns no slot: its cache is a private copy.
        return None


class SlotPool:
    def __init__(
        self, capacities, buffer, n_kv_heads, head_dim, dtype, device, block_slots, n_q_heads=0, window=0
    ):
        self.capacities = tuple(capacities)
        self.buffer = buffer  # r: rows of one run stay within r of each other in length
        self._shape = (n_kv_heads, head_dim)
        self._ring_shape = (len(self.capacities), n_q_heads, window + 1, head_dim) if window else None
        self._dtype, self._device = dtype, device
        self.block_slots = block_slots
        self.blocks: list[SlotBlock] = []
        self._free: list[tuple[int, int]] = []
        self._lock = threading.Lock()

    def _new_block(self) -> None:
        h, d, s = *self._shape, self.block_slots
        # Zeros, not empty: padded rows of a batch read these entries under a -inf mask, and
        # 0 * NaN from uninitialised memory would still poison the output.
        kw = dict(device=self._device)
        widths = [slab_width(c, torch.device(self._device)) for c in self.capacities]
        block = SlotBlock(
            keys=[torch.zeros((s, h, w, d), dtype=self._dtype, **kw) for w in widths],
            values=[torch.zeros((s, h, w, d), dtype=self._dtype, **kw) for w in widths],
            positions=[torch.full((s, h, w), -1, dtype=torch.long, **kw) for w in widths],
            ring=None
            if self._ring_shape is None
            else torch.zeros((s, *self._ring_shape), dtype=self._dtype, **kw),
        )
        b = len(self.blocks)
        self.blocks.append(block)
        # Lowest index first, so live sessions cluster at the front of a block (long runs).
        self._free.extend((b, i) for i in reversed(range(s)))
        self._free.sort(reverse=True)

    def acquire(self) -> Slot:
        with self._lock:
            if not self._free:
                self._new_block()
            return self._take()

    def lower(self, slot: Slot) -> Slot | None:
        """A free slot before `slot` (an earlier block, or earlier in its block), taken, or None.
        The caller moves its session there and then releases `slot` (`EvictableCache.move_to`)."""
        with self._lock:
            if not self._free or self._free[-1] >= (slot.block_index, slot.index):
                return None
            return self._take()

    def _take(self) -> Slot:
        b, i = self._free.pop()
        slot = Slot(self, b, i)
        for p in slot.block.positions:
            p[i].fill_(-1)  # an empty slab: the last owner's entries (or a scratch write) gone
        return slot

    def release(self, slot: Slot) -> None:
        with self._lock:
            self._free.append((slot.block_index, slot.index))
            self._free.sort(reverse=True)
            # Trailing blocks nobody holds a slot of give their memory back (all of them: a solo
            # engine makes a pool per budget). Only trailing ones: a slot's block index is fixed.
            while self.blocks and sum(b == len(self.blocks) - 1 for b, _ in self._free) == self.block_slots:
                self.blocks.pop()
                self._free = [f for f in self._free if f[0] < len(self.blocks)]

    @property
    def in_use(self) -> int:
        return len(self.blocks) * self.block_slots - len(self._free)

    def slot_nbytes(self) -> int:
        """Bytes one slot's session holds over all layers (keys + values + positions; a session's
        `kv_bytes`). The scratch column, one entry a head and layer, is the pool's (`nbytes`)."""
        h, d = self._shape
        item = torch.empty((), dtype=self._dtype).element_size()
        return sum(h * c * (2 * d * item + 8) for c in self.capacities)

    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for b in self.blocks
            for t in (*b.keys, *b.values, *b.positions, *([] if b.ring is None else [b.ring]))
        )
