"""What an evictable cache records of the queries, for the policies that score with them.

The window: the last W post-RoPE queries of every layer, in a ring of W entries (+1 scratch, the
index the static step's empty rows write to) per layer: the slot's part of its pool's ring
(pool.py), or a private one. Every forward writes its newest queries there at indices the host
chose before it ran (`begin_forward`; the static step: `ring_head`), so recording costs no
concatenation and no shape changes with the window's fill. Every layer records the same tokens,
so one head, count and position list serve all layers. Pending queries (H2O): every query since a
layer's last round, a list per layer.
"""

from __future__ import annotations

import torch

PAD = -1  # position of a padding entry (a head holding fewer entries than the layer's n)


class QueryRecord:
    """The query side of `cache.EvictableCache` (a mixin: the cache's layers are `self.layers`)."""

    layers: list

    def init_queries(self, n_layers: int, window: int, record: bool, keep_pending: bool) -> None:
        self.window = window
        self.record = record
        self.keep_pending = keep_pending
        self.current_positions: torch.Tensor | None = None  # logical positions of the running chunk
        self.ring: torch.Tensor | None = None  # (L, H_q, W + 1, D)
        self.ring_positions = [PAD] * window  # host copy: the position recorded at each index
        self.ring_head = 0  # the index the next query goes to
        self.ring_count = 0  # recorded queries held (<= W): the ring_count before ring_head
        self._chunk_index: torch.Tensor | None = None  # this forward's ring indices
        self._chunk_take = 0  # this forward's newest tokens that it records (<= W)
        self._order: tuple[torch.Tensor, torch.Tensor] | None = None  # ring indices, oldest first; positions
        self.pending_queries: list[list[torch.Tensor]] = [[] for _ in range(n_layers)]
        self.pending_positions: list[list[torch.Tensor]] = [[] for _ in range(n_layers)]

    def begin_forward(self, positions: torch.Tensor, first: int) -> None:
        """Before a forward of the chunk at logical positions `first`, first + 1, ...: where its
        newest (at most W) queries go in the ring. Host arithmetic only."""
        self.current_positions = positions
        if not self.record:
            return
        w, q = self.window, positions.shape[0]
        take = min(q, w)
        index = [(self.ring_head + j) % w for j in range(take)]
        for j, i in enumerate(index):
            self.ring_positions[i] = first + q - take + j
        self.ring_head = (self.ring_head + take) % w
        self.ring_count = min(self.ring_count + take, w)
        self._chunk_index = torch.tensor(index, device=positions.device)
        self._chunk_take = take
        self._order = None

    def ring_view(self, like: torch.Tensor) -> torch.Tensor:
        """The ring, made on first use: the slot's part of its pool's ring, else private."""
        if self.ring is None:
            slot_ring = self.slot.ring() if self.slot is not None else None
            if slot_ring is not None:
                self.ring = slot_ring
            else:
                n_layers, h_q, d = len(self.layers), like.shape[1], like.shape[-1]
                self.ring = like.new_zeros((n_layers, h_q, self.window + 1, d))
        return self.ring

    def record_queries(self, layer_idx: int, query: torch.Tensor) -> None:
        """This layer's (1, H_q, q, D) queries of the running forward (`begin_forward` first)."""
        if not self.record:
            return
        ring = self.ring_view(query)
        ring[layer_idx].index_copy_(1, self._chunk_index, query[0, :, query.shape[2] - self._chunk_take :])
        if self.keep_pending:
            self.pending_queries[layer_idx].append(query.detach())
            self.pending_positions[layer_idx].append(self.current_positions)

    def stepped(self, position: int, position_tensor: torch.Tensor) -> None:
        """The static step wrote this cache's token at `position`: its K/V at every layer's n and its
        queries at ring_head (step.py). The host bookkeeping that follows. `position_tensor`: the
        position as a (1,) device tensor (the step's staging input), so no host copy is made."""
        for layer in self.layers:
            layer.n += 1
        i = self.ring_head
        self.ring_positions[i] = position
        self.ring_head = (i + 1) % self.window
        self.ring_count = min(self.ring_count + 1, self.window)
        self._order = None
        if self.keep_pending:
            q = self.ring[:, :, i].clone()  # (L, H_q, D): the ring is overwritten W tokens on
            pos = position_tensor.clone()  # the staging row is refilled next step
            for li in range(len(self.layers)):
                self.pending_queries[li].append(q[li, None, :, None])
                self.pending_positions[li].append(pos)

    def _window_order(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.ring_count == 0:
            return None
        if self._order is None:
            w, n = self.window, self.ring_count
            index = [(self.ring_head - n + j) % w for j in range(n)]
            positions = [self.ring_positions[i] for i in index]
            dev = self.ring.device
            if positions == list(range(positions[0], positions[0] + n)):
                # The usual case (the stream's newest tokens): made on the device, so a round
                # copies nothing from the host (on a GPU, a pageable copy that waits for the queue).
                steps = torch.arange(n, device=dev)
                self._order = ((steps + (self.ring_head - n)) % w, steps + positions[0])
            else:
                self._order = (torch.tensor(index, device=dev), torch.tensor(positions, device=dev))
        return self._order

    @property
    def window_queries(self) -> _Window:
        """window_queries[li]: layer li's recorded queries (1, H_q, w, D), oldest first; None if none."""
        return _Window(self, queries=True)

    @property
    def window_positions(self) -> _Window:
        """window_positions[li]: their logical positions (w,); None if none."""
        return _Window(self, queries=False)

    def load_window(self, queries: torch.Tensor | None, positions: list[int]) -> None:
        """Hold exactly these recorded queries (L, H_q, w, D), oldest first (a restored session)."""
        self.ring_positions = [PAD] * self.window
        self.ring_head = self.ring_count = 0
        self._order = None
        if queries is None or not positions:
            return
        w = len(positions)
        self.ring_view(queries[0][None])[:, :, :w] = queries
        self.ring_positions[:w] = positions
        self.ring_head, self.ring_count = w % self.window, w

    def take_pending(self, layer_idx: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        qs, ps = self.pending_queries[layer_idx], self.pending_positions[layer_idx]
        if not qs:
            return None, None
        q, p = torch.cat(qs, dim=2), torch.cat(ps)
        self.pending_queries[layer_idx], self.pending_positions[layer_idx] = [], []
        return q, p

    def drop_queries_from(self, cut: int) -> None:
        """Forget the recorded queries of positions >= cut (their tokens left the stream)."""
        w = self.window
        while self.ring_count and self.ring_positions[(self.ring_head - 1) % w] >= cut:
            self.ring_head = (self.ring_head - 1) % w
            self.ring_positions[self.ring_head] = PAD
            self.ring_count -= 1
        self._order = None
        for li in range(len(self.layers)):
            qs, ps = [], []
            for q, p in zip(self.pending_queries[li], self.pending_positions[li], strict=True):
                keep = p < cut
                if keep.any():
                    qs.append(q[:, :, keep])
                    ps.append(p[keep])
            self.pending_queries[li], self.pending_positions[li] = qs, ps

    def pending_count(self, layer_idx: int) -> int:
        return sum(q.shape[2] for q in self.pending_queries[layer_idx])


class _Window:
    """`cache.window_queries[li]` / `cache.window_positions[li]`: the ring read oldest first."""

    def __init__(self, cache: QueryRecord, queries: bool) -> None:
        self.cache, self.queries = cache, queries

    def __getitem__(self, li: int) -> torch.Tensor | None:
        order = self.cache._window_order()
        if order is None:
            return None
        if not self.queries:
            return order[1]
        return self.cache.ring[li].index_select(1, order[0]).unsqueeze(0)
