"""The evictable KV cache: per layer keys, values and the logical position of every entry.

An evicting session with a token budget keeps each layer in a fixed slab: views of its slot in a
pool (`pool.py`), solo or batched, compacted in place by rounds and never reallocated; past the
live entries every position is -1, which is all the static decode step (step.py) needs to attend
it. A layer that must outgrow its slot (scope `prefill` overflow) moves to private buffers until a
compaction brings it back. Other caches (dense, fractional budgets, a reprefill rebuild) use a
private capacity buffer per layer, and `compact` gathers the kept entries into a NEW, smaller one,
so evicted memory is really freed. Entries stay in logical-position order.

`Session.forget` and `Session.rewind` can leave the heads of a layer holding different counts. The layout stays
rectangular: a head with fewer entries starts with padding entries at position -1 (`PAD`), which
attention masks out (the layer is then `ragged`) and rounds drop before any real entry.
"""

from __future__ import annotations

import copy
import weakref

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from kvagent.runtime.queries import PAD, QueryRecord


def keep_index(positions: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:
    """(B, H_kv, M) index of the entries to keep, M = the most any head keeps; a head keeping
    fewer starts with -1 (PAD). Kept entries stay in position order; old PADs are not kept."""
    keep = ~drop & (positions >= 0)
    counts = keep.sum(dim=-1, keepdim=True)
    m = int(counts.max().item()) if counts.numel() else 0
    order = (~keep).to(torch.int8).argsort(dim=-1, stable=True)  # kept entries first, in order
    src = torch.arange(m, device=positions.device) - (m - counts)  # right-align each head's kept run
    return order.gather(-1, src.clamp(min=0)).masked_fill_(src < 0, -1)


class LayerBase(CacheLayerMixin):
    """What transformers asks of every kvagent cache layer; `stores()` are the tensors it holds."""

    is_sliding = False
    n = 0

    # The layer's cache, held weakly: a strong reference both ways would be a cycle, and a closed
    # session's slot slabs (its layers' views) would stay allocated until the garbage collector ran.
    @property
    def owner(self):
        return self._owner()

    @owner.setter
    def owner(self, cache) -> None:
        self._owner = weakref.ref(cache)

    def stores(self) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def write(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """`update` less its return: a packed forward attends each layer itself (forward.py)."""
        self.update(key_states, value_states)

    def live_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The live keys and values, as `live()` has them."""
        return self.live()[:2]

    def nbytes(self) -> int:
        if not self.is_initialized:
            return 0
        return sum(t.numel() * t.element_size() for t in self.stores())

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.n + query_length, 0

    def get_seq_length(self) -> int:
        return self.n

    def get_max_length(self) -> int:
        return -1


class EvictableLayer(LayerBase):
    """One layer: keys/values (B, H_kv, cap, D), positions (B, H_kv, cap); the first `n` are live."""

    def __init__(self, owner: EvictableCache, layer_idx: int) -> None:
        super().__init__()
        self.owner = owner
        self.layer_idx = layer_idx
        self.n = 0
        self.capacity_hint = 0  # preferred capacity (K + r when evicting) so decode never reallocates
        self.positions: torch.Tensor | None = None
        self.in_slot = False  # keys/values/positions are views of owner.slot (batched engines)
        self.ragged = False  # some head starts with PAD entries (after Session.forget)

    def _slot_views(self):
        slot = self.owner.slot
        return slot.views(self.layer_idx) if slot is not None else None

    def nbytes(self) -> int:
        if not self.is_initialized and self.owner.slot is not None:
            # A slot's slab is the session's from its start: the pool allocated it then.
            return sum(t.numel() * t.element_size() for t in self._slot_views())
        return super().nbytes()

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        views = self._slot_views()
        if views is not None and key_states.shape[-2] <= views[0].shape[-2]:
            self.keys, self.values, self.positions = views
            self.device = key_states.device
            self.is_initialized = self.in_slot = True
            return
        b, h, _, d = key_states.shape
        cap = max(self.capacity_hint, key_states.shape[-2], 16)
        self.keys = key_states.new_empty((b, h, cap, d))
        self.values = value_states.new_empty((b, h, cap, value_states.shape[-1]))
        self.positions = torch.empty((b, h, cap), dtype=torch.long, device=key_states.device)
        self.device = key_states.device
        self.is_initialized = True

    def _grow(self, need: int) -> None:
        cap = self.keys.shape[-2]
        new_cap = max(need, 2 * cap, self.capacity_hint)
        keys = self.keys.new_empty((*self.keys.shape[:2], new_cap, self.keys.shape[-1]))
        values = self.values.new_empty((*self.values.shape[:2], new_cap, self.values.shape[-1]))
        positions = self.positions.new_empty((*self.positions.shape[:2], new_cap))
        keys[:, :, : self.n] = self.keys[:, :, : self.n]
        values[:, :, : self.n] = self.values[:, :, : self.n]
        positions[:, :, : self.n] = self.positions[:, :, : self.n]
        self.keys, self.values, self.positions = keys, values, positions
        self.in_slot = False

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.write(key_states, value_states)
        return self.keys[:, :, : self.n], self.values[:, :, : self.n]

    def write(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self.n
        end = n + key_states.shape[-2]
        if end > self.keys.shape[-2]:
            self._grow(end)
        self.keys[:, :, n:end] = key_states
        self.values[:, :, n:end] = value_states
        self.positions[:, :, n:end] = self.owner.current_positions
        self.n = end

    def live(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.keys[:, :, : self.n], self.values[:, :, : self.n], self.positions[:, :, : self.n]

    def live_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[:, :, : self.n], self.values[:, :, : self.n]

    def compact(self, index: torch.Tensor, capacity: int, pad: bool = False) -> None:
        """Keep entries `index` (B, H_kv, M), sorted along M, in fresh tensors of `capacity`.
        With `pad`, index -1 (only at the front of a head) makes a PAD entry there."""
        keys, values, positions = self.live()
        m = index.shape[-1]
        src = index.clamp(min=0) if pad else index
        # Gather to temporaries first: in a slot, source and destination may overlap.
        k = keys.gather(2, src.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1]))
        v = values.gather(2, src.unsqueeze(-1).expand(-1, -1, -1, values.shape[-1]))
        p = positions.gather(2, src)
        if pad:
            p.masked_fill_(index < 0, PAD)
        if pad or self.ragged:
            self.ragged = bool((p < 0).any())
        views = self._slot_views()
        if views is not None and m <= views[0].shape[-2]:
            self.keys, self.values, self.positions = views
            self.keys[:, :, :m], self.values[:, :, :m], self.positions[:, :, :m] = k, v, p
            self.positions[:, :, m:].fill_(PAD)  # the slab's invariant: nothing live past n
            self.n, self.in_slot = m, True
            return
        cap = max(capacity, m)
        new_k = keys.new_empty((*keys.shape[:2], cap, keys.shape[-1]))
        new_v = values.new_empty((*values.shape[:2], cap, values.shape[-1]))
        new_p = positions.new_empty((*positions.shape[:2], cap))
        new_k[:, :, :m], new_v[:, :, :m], new_p[:, :, :m] = k, v, p
        self.keys, self.values, self.positions, self.n = new_k, new_v, new_p, m
        self.in_slot = False

    def load(self) -> int:
        """Entries per head: what a round's trigger compares with K + r."""
        return self.n

    def held(self) -> int:
        """Real (head, entry) pairs held, PADs not counted."""
        if not self.is_initialized:
            return 0
        if self.ragged:
            return int((self.live()[2] >= 0).sum().item())
        return self.n * self.keys.shape[0] * self.keys.shape[1]

    def valid(self, length: int | None = None) -> torch.Tensor | None:
        """(B, H_kv, length) bool: which of the first `length` entries are real; None if all are."""
        if not self.ragged:
            return None
        return self.positions[:, :, : self.n if length is None else length] >= 0

    def attach_slot(self) -> None:
        """Move the live entries into the owner's slot (after a reprefill compressed them to K)."""
        views = self._slot_views()
        if views is None or not self.is_initialized or self.in_slot or self.n > views[0].shape[-2]:
            return
        keys, values, positions = self.live()
        views[0][:, :, : self.n], views[1][:, :, : self.n], views[2][:, :, : self.n] = keys, values, positions
        views[2][:, :, self.n :] = PAD
        self.keys, self.values, self.positions = views
        self.in_slot = True

    def __deepcopy__(self, memo):
        # A copy (the fact probe's branch) owns no slot: its slab views become private clones of the
        # slot's part (deepcopy would copy the whole pool block behind a view).
        if self.in_slot:
            for t in (self.keys, self.values, self.positions):
                memo[id(t)] = t.clone()
        new = copy.copy(self)
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            setattr(new, name, copy.deepcopy(value, memo))
        new.in_slot = False
        return new

    def stores(self) -> tuple[torch.Tensor, ...]:
        return self.keys, self.values, self.positions

    def reset(self) -> None:
        self.keys = self.values = self.positions = None
        self.n = 0
        self.is_initialized = self.in_slot = self.ragged = False


class EvictableCache(QueryRecord, Cache):
    """A transformers Cache whose layers can be compacted, plus what policies need to score them
    (queries.py): each layer's recent queries (window, a ring) and, for policies that ask, all
    queries since its last round."""

    def __init__(
        self,
        n_layers: int,
        window: int,
        record: bool,
        keep_pending: bool,
        slot=None,
        layer_class: type | None = None,  # adaptive heads: heads.HeadLayer, a buffer per KV head
    ):
        super().__init__(layers=[(layer_class or EvictableLayer)(self, i) for i in range(n_layers)])
        self.slot = slot  # a pool Slot (evicting sessions with a token budget), else None
        self.init_queries(n_layers, window, record, keep_pending)

    def __deepcopy__(self, memo):
        # A copy owns no slot (pool.Slot.__deepcopy__): a ring that is a view of the pool's is cloned.
        if self.ring is not None and self.slot is not None:
            memo[id(self.ring)] = self.ring.clone()
        new = copy.copy(self)
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            setattr(new, name, copy.deepcopy(value, memo))
        for layer in new.layers:
            layer.owner = new  # a weak reference is copied as it is: point it at the copy
        return new

    def entries(self) -> list[int]:
        return [layer.n for layer in self.layers]

    def loads(self) -> list[int]:
        return [layer.load() for layer in self.layers]

    def move_to(self, slot) -> None:
        """Carry every layer living in the current slot into `slot` (an empty one of the same pool,
        `SlotPool.lower`), entries and window ring copied as they are; the caller releases the old."""
        for layer in self.layers:
            if layer.in_slot:
                layer.in_slot = False  # attach_slot copies its live entries out of the old views
        self.attach_slot(slot)

    def attach_slot(self, slot) -> None:
        self.slot = slot
        for layer in self.layers:
            layer.attach_slot()
        if self.ring is not None and slot is not None and slot.ring() is not None:
            slot.ring().copy_(self.ring)
            self.ring = slot.ring()

    # ----------------------------------------------------------------- persistence (runtime/persist.py)
    # The only code outside this module that needs the layout is these two methods: a saved session
    # is this state, and whoever changes the layout keeps them in step (tests/runtime/test_persist.py).
    def export_state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """Everything a later forward or round reads: per layer the live keys, values and positions
        (PAD entries kept; adaptive layers per KV head), n, ragged and capacity (so a restored layer
        has the same strides), the window and pending queries with their positions. Tensors are
        contiguous clones on their device; meta is JSON-able."""
        tensors: dict[str, torch.Tensor] = {}
        layers = []
        for li, layer in enumerate(self.layers):
            if not layer.is_initialized:
                layers.append({"init": False})
            elif hasattr(layer, "head_keys"):  # heads.HeadLayer: a buffer per KV head
                for h, c in enumerate(layer.counts):
                    tensors[f"layers.{li}.head{h}.keys"] = layer.head_keys[h][:c].contiguous().clone()
                    tensors[f"layers.{li}.head{h}.values"] = layer.head_values[h][:c].contiguous().clone()
                    tensors[f"layers.{li}.head{h}.positions"] = (
                        layer.head_positions[h][:c].contiguous().clone()
                    )
                caps = [k.shape[0] for k in layer.head_keys]
                layers.append({"init": True, "counts": list(layer.counts), "capacities": caps})
            else:
                keys, values, positions = layer.live()
                tensors[f"layers.{li}.keys"] = keys.contiguous().clone()
                tensors[f"layers.{li}.values"] = values.contiguous().clone()
                tensors[f"layers.{li}.positions"] = positions.contiguous().clone()
                cap = layer.keys.shape[-2]
                layers.append({"init": True, "n": layer.n, "ragged": layer.ragged, "capacity": cap})
        for li in range(len(self.layers)):
            if self.window_queries[li] is not None:
                tensors[f"window.{li}.queries"] = self.window_queries[li].contiguous().clone()
                tensors[f"window.{li}.positions"] = self.window_positions[li].contiguous().clone()
            for j, (q, p) in enumerate(
                zip(self.pending_queries[li], self.pending_positions[li], strict=True)
            ):
                tensors[f"pending.{li}.{j}.queries"] = q.contiguous().clone()
                tensors[f"pending.{li}.{j}.positions"] = p.contiguous().clone()
        meta = {
            "layers": layers,
            "window": [self.window_queries[li] is not None for li in range(len(self.layers))],
            "pending": [len(qs) for qs in self.pending_queries],
            "slot": self.slot is not None,  # reprefill attaches its slot only once compressed
        }
        return tensors, meta

    def import_state(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        """Make this fresh cache hold what `export_state` gave (tensors already on this cache's
        device and dtype; shapes checked by the caller). Live entries go into this cache's slot
        where they fit, as compaction puts them, else into private buffers of the saved capacity.
        (A reprefill cache saved with its slot attached gets `attach_slot` first: the caller's.)"""
        for li, (layer, m) in enumerate(zip(self.layers, meta["layers"], strict=True)):
            layer.reset()
            if not m["init"]:
                continue
            if "counts" in m:
                for name in ("keys", "values", "positions"):
                    store = getattr(layer, f"head_{name}")
                    for h, cap in enumerate(m["capacities"]):
                        src = tensors[f"layers.{li}.head{h}.{name}"]
                        buf = src.new_empty((cap, *src.shape[1:]))
                        buf[: src.shape[0]] = src
                        store.append(buf)
                layer.counts = list(m["counts"])
                layer.keys, layer.values = layer.head_keys[0], layer.head_values[0]
                layer.device = layer.keys.device
                layer.is_initialized = True
                continue
            k, v, p = (tensors[f"layers.{li}.{name}"] for name in ("keys", "values", "positions"))
            n = m["n"]
            views = layer._slot_views()
            if views is not None and n <= views[0].shape[-2]:
                layer.keys, layer.values, layer.positions = views
                layer.in_slot = True
            else:
                cap = m["capacity"]
                layer.keys = k.new_empty((*k.shape[:2], cap, k.shape[-1]))
                layer.values = v.new_empty((*v.shape[:2], cap, v.shape[-1]))
                layer.positions = p.new_empty((*p.shape[:2], cap))
            layer.keys[:, :, :n], layer.values[:, :, :n], layer.positions[:, :, :n] = k, v, p
            layer.positions[:, :, n:] = PAD  # a slab holds nothing live past n (pool.py)
            layer.n, layer.ragged = n, bool(m["ragged"])
            layer.device = k.device
            layer.is_initialized = True
        # Every layer records the same tokens, so one ring index serves all layers.
        if meta["window"] and all(meta["window"]):
            queries = torch.cat([tensors[f"window.{li}.queries"] for li in range(len(self.layers))])
            self.load_window(queries, tensors["window.0.positions"].tolist())
        else:
            self.load_window(None, [])
        for li in range(len(self.layers)):
            self.pending_queries[li] = [
                tensors[f"pending.{li}.{j}.queries"] for j in range(meta["pending"][li])
            ]
            self.pending_positions[li] = [
                tensors[f"pending.{li}.{j}.positions"] for j in range(meta["pending"][li])
            ]
