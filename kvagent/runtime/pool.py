"""Slot pools: where batched evicting sessions keep their KV, so a batch needs no copying.

A pool serves sessions whose layers have the same capacities (K_l + r). Per layer it holds
`(S, H_kv, K_l + r, D)` key/value buffers and `(S, H_kv, K_l + r)` positions in blocks of
`max_batch` slots; a session owns one slot (the same index in every layer) for its lifetime and
compacts in place. Batched attention then reads `keys[s0:s1, :, :n_max]` of one block, a view, for
sessions holding consecutive slots. Blocks are never reallocated, so a compaction in one thread can
never race a growth in another; a new block is added when every slot is taken.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch


@dataclass(eq=False)
class SlotBlock:
    keys: list[torch.Tensor]  # per layer (S, H_kv, C_l, D)
    values: list[torch.Tensor]
    positions: list[torch.Tensor]  # per layer (S, H_kv, C_l)


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
        """This slot's (1, H_kv, C_l, D) key/value and (1, H_kv, C_l) position views of one layer."""
        i, b = self.index, self.block
        return b.keys[layer_idx][i : i + 1], b.values[layer_idx][i : i + 1], b.positions[layer_idx][i : i + 1]


class SlotPool:
    def __init__(self, capacities, buffer, n_kv_heads, head_dim, dtype, device, block_slots):
        self.capacities = tuple(capacities)
        self.buffer = buffer  # r: rows of one run stay within r of each other in length
        self._shape = (n_kv_heads, head_dim)
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
        block = SlotBlock(
            keys=[torch.zeros((s, h, c, d), dtype=self._dtype, **kw) for c in self.capacities],
            values=[torch.zeros((s, h, c, d), dtype=self._dtype, **kw) for c in self.capacities],
            positions=[torch.zeros((s, h, c), dtype=torch.long, **kw) for c in self.capacities],
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
            b, i = self._free.pop()
            return Slot(self, b, i)

    def release(self, slot: Slot) -> None:
        with self._lock:
            self._free.append((slot.block_index, slot.index))
            self._free.sort(reverse=True)

    @property
    def in_use(self) -> int:
        return len(self.blocks) * self.block_slots - len(self._free)

    def slot_nbytes(self) -> int:
        """Bytes one slot holds over all layers (keys + values + positions)."""
        h, d = self._shape
        item = torch.empty((), dtype=self._dtype).element_size()
        return sum(h * c * (2 * d * item + 8) for c in self.capacities)

    def nbytes(self) -> int:
        return len(self.blocks) * self.block_slots * self.slot_nbytes()
