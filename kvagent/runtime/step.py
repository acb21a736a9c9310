"""The static decode step's runner: which forwards it takes, its buffers per batch size, and how it
runs (eager, compiled or a captured CUDA graph).

A forward goes the static way when every chunk is one decode token of a session whose every layer
lives in its slot (pool.py) with room for the token, all in one pool block: the rows are B
consecutive slots of that block from the lowest slot taken, B the smallest batch size (1, 2, 4,
...) that covers the highest, so one function (compiled or captured) per (block, first slot, B)
serves every step, and a session stepping alone computes with B = 1 in whichever slot it holds
(the same numbers, bit for bit, wherever it lives). Rows whose slot has no token this step are
empty rows (decoder.py). Everything else (prefill chunks, dense,
fractional, adaptive or reprefill-rebuilding caches, a layer outgrown into private memory, a
mix of pools) runs the eager forward (forward.py), which writes the same slabs.

Per step the host fills five small input buffers (pinned on CUDA, copied without blocking), runs
the step and does the bookkeeping that follows (each session's entry counts and window ring,
`EvictableCache.stepped`). Modes (`Engine.load(decode_step=...)`):
- `eager`: no static step; every forward is forward.py's.
- `static`: the static step, run op by op (on a CPU over oneDNN-packed weights, linear.py).
- `compiled`: the static step under `torch.compile(fullgraph=True, dynamic=False)`, compiled on
  first use for each batch size B.
- `graph` (CUDA): the static step captured in a CUDA graph per (block, first slot, B) on first use, all
  graphs in one memory pool, replayed every step; its RMSNorm, RoPE and activation compiled
  (`Decoder.compile_parts`).
- `auto`: `graph` on CUDA, `static` on a CPU.
"""

from __future__ import annotations

import torch

from kvagent.errors import ConfigError
from kvagent.runtime.decoder import Decoder, decoder_for

MODES = ("auto", "eager", "static", "compiled", "graph")


def resolve_mode(mode: str, device: torch.device) -> str:
    if mode not in MODES:
        raise ConfigError(f"decode_step: got {mode!r}; choose {', '.join(MODES)}")
    if mode == "auto":
        return "graph" if device.type == "cuda" else "static"
    if mode == "graph" and device.type != "cuda":
        raise ConfigError("decode_step: graph needs CUDA; use static or compiled on a CPU")
    return mode


class StaticBatch:
    """The static buffers of one (pool block, first slot, B): inputs, views of the B slots' slabs,
    and the function that runs on them."""

    def __init__(self, runner: StepRunner, pool, block, first: int, size: int) -> None:
        dev = runner.device
        n_layers = len(pool.capacities)
        self.block, self.first, self.size, self.pool = block, first, size, pool
        self.caps = pool.capacities
        self.window = block.ring.shape[3] - 1
        pin = dev.type == "cuda"
        # Host staging, one row per input: ids, pos, wpos, ridx, then lens (L rows).
        self.host = torch.empty((4 + n_layers, size), dtype=torch.long, pin_memory=pin)
        # An empty row's inputs: token 0 at position 0, recorded as -1, written to the scratch column
        # of every layer (C_l) and of the ring (W); made once, copied in at every fill.
        empty = [0, 0, -1, self.window, *self.caps]
        self.empty = torch.tensor(empty, dtype=torch.long)[:, None].expand(-1, size).numpy().copy()
        self.inputs = torch.empty((4 + n_layers, size), dtype=torch.long, device=dev)
        self.args = (
            self.inputs[0],
            self.inputs[1],
            self.inputs[2],
            self.inputs[4:],
            self.inputs[3],
            [k[first : first + size] for k in block.keys],
            [v[first : first + size] for v in block.values],
            [p[first : first + size] for p in block.positions],
            block.ring[first : first + size],
        )
        self.logits: torch.Tensor | None = None
        self.graph = None
        self.copied = torch.cuda.Event() if pin else None  # the last copy out of `host` is done
        self.fn = runner.fn
        self.runner = runner

    def fill(self, rows: dict[int, tuple[int, int, list[int], int]]) -> None:
        """rows: slot index -> (token id, position, per-layer entry count, ring index)."""
        if self.copied is not None:
            self.copied.synchronize()  # the previous step's copy may still read the staging rows
        h = self.host.numpy()
        h[:] = self.empty  # every row empty (scratch column, position -1) until a session fills it
        for slot, (token, position, lens, ring_index) in rows.items():
            i = slot - self.first
            h[0, i], h[1, i], h[2, i], h[3, i] = token, position, position, ring_index
            h[4:, i] = lens
        self.inputs.copy_(self.host, non_blocking=True)
        if self.copied is not None:
            self.copied.record()

    def run(self) -> torch.Tensor:
        if self.runner.mode != "graph":
            return self.fn(*self.args)
        if self.graph is None:
            self.graph, self.logits = self.runner.capture(self.fn, self.args)
        self.graph.replay()
        return self.logits


class StepRunner:
    """One per engine: the static batches by (block, first slot, B), made on first use."""

    def __init__(self, engine, mode: str, decoder: Decoder | None = None) -> None:
        self.device = engine.device
        self.mode = resolve_mode(mode, engine.device)
        # Built once per engine (it fuses the weights); kept, unused, by an eager runner.
        self.plain = decoder if decoder is not None else decoder_for(engine.model, engine.scaling)
        self.enabled = self.mode != "eager" and self.plain is not None
        # What the step runs: over the engine's packed weights where it packs them (linear.py),
        # except compiled, which cannot trace a packed weight.
        packs = getattr(engine, "packs", None)
        packed = self.enabled and packs is not None and self.mode == "static"
        self.decoder = self.plain.packed(packs) if packed else self.plain
        if self.enabled and self.mode == "graph":
            self.decoder.compile_parts()  # norms, RoPE, activation: one kernel each in the graph
        # One compiled function for every batch: it compiles once per B (the first slot changes
        # only the views' storage offsets, which its guards do not check).
        self.compiled = None
        if self.enabled and self.mode == "compiled":
            self.compiled = torch.compile(self.decoder.__call__, fullgraph=True, dynamic=False)
        self.fn = self.compiled or self.decoder
        self.batches: dict[tuple[int, int, int], StaticBatch] = {}
        self.max_slots = engine.max_batch
        self.steps = 0  # forwards the static step ran (tests, benchmarks)
        self._graph_pool = None

    def plan(self, chunks) -> tuple | None:
        """(pool, block, first slot, B) when the static step takes these chunks, else None."""
        if not self.enabled:
            return None
        first = chunks[0].cache.slot
        if first is None:
            return None
        pool, block = first.pool, first.block
        if block.ring is None:
            return None
        top, low = 0, pool.block_slots
        for c in chunks:
            slot = c.cache.slot
            if len(c.ids) != 1 or slot is None or slot.pool is not pool or slot.block is not block:
                return None
            if not _fits(c.cache, slot, pool.capacities):
                return None
            top, low = max(top, slot.index + 1), min(low, slot.index)
        size = 1
        while size < top - low:
            size *= 2
        size = min(size, pool.block_slots)
        return pool, block, min(low, pool.block_slots - size), size

    def run(self, chunks, plan) -> None:
        pool, block, first, size = plan
        key = (id(block), first, size)
        batch = self.batches.get(key)
        if batch is None or batch.block is not block:
            # A pool whose slots all came free dropped its blocks: their batches (and graphs) go too.
            for k in [k for k, b in self.batches.items() if not any(x is b.block for x in b.pool.blocks)]:
                del self.batches[k]
            batch = self.batches[key] = StaticBatch(self, pool, block, first, size)
        rows = {}
        for c in chunks:
            cache = c.cache
            cache.current_positions = c.positions
            rows[cache.slot.index] = (c.ids[0], c.first, [layer.n for layer in cache.layers], cache.ring_head)
        batch.fill(rows)
        logits = batch.run()
        order = [c.cache.slot.index - first for c in chunks]
        picked = logits.index_select(
            0, torch.tensor(order, device=logits.device)
        )  # a copy: the buffer is reused
        for i, c in enumerate(chunks):
            c.cache.stepped(c.first)
            c.logits = picked[i : i + 1]
        self.steps += 1

    def capture(self, fn, args):
        """A CUDA graph of `fn(*args)` (warmed up on a side stream first), in the engine's one pool."""
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn(*args)  # warm-up: kernels chosen, workspaces allocated outside the graph
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            out = fn(*args)
        return graph, out


def _fits(cache, slot, caps) -> bool:
    """Every layer in its slot with room for one more entry, and the ring the slot's own."""
    if not cache.record or cache.ring is None or cache.ring.data_ptr() != slot.ring().data_ptr():
        return False
    for layer, cap in zip(cache.layers, caps, strict=True):
        if not layer.in_slot or layer.n >= cap:
            return False
    return True
