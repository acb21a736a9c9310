"""The static decode step's runner: which forwards it takes, its buffers per batch size, and how it
runs (eager, compiled or a captured CUDA graph).

A forward goes the static way when every chunk is one decode token of a session whose every layer
lives in its slot (pool.py) with room for the token, all in one pool block: the rows are B
consecutive slots of that block, B the smallest batch size (1, 2, 4, ..., the block's size) whose
window covers the slots stepping (`rows`: from slot 0 for captured graphs, so a block has one graph
per B, all captured before the first step by `prepare`, called when a session takes its slot; from
the B-aligned slot otherwise). Live sessions sit at the front of their block (`Evictor.settle`), so
the rows are mostly live; rows whose slot has no token this step are empty rows (decoder.py). Everything else runs the eager forward
(forward.py), which writes the same slabs, and says why (`EAGER_REASONS`, counted per reason).

Per step the host fills one pinned staging buffer (ids, positions, ring indices, the rows' order
and each layer's entry counts), copies it without blocking, runs the step and does the bookkeeping
that follows (`EvictableCache.stepped`). Nothing in a step reads a value back to the host. Modes
(`Engine.load(decode_step=...)`):
- `eager`: no static step; every forward is forward.py's.
- `static`: the static step, run op by op (on a CPU over oneDNN-packed weights, linear.py).
- `compiled`: the static step under `torch.compile(fullgraph=True, dynamic=False)`, compiled for
  every batch size when a block is prepared.
- `graph` (CUDA): the static step captured in a CUDA graph per (block, B) when the block is
  prepared (thread-local capture mode: other threads may sync or allocate meanwhile), all graphs in
  one memory pool, replayed every step; its RMSNorm, RoPE and activation compiled
  (`Decoder.compile_parts`). A capture that fails leaves that key on the uncaptured static step,
  counted (`capture_failures`) and logged once; the forward never fails for it.
- `auto`: `graph` on CUDA, `static` on a CPU.

A block's batches live on the block (`SlotBlock.batches`): when its last session leaves and the pool
drops it, its buffers and graphs go with it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter

import torch

from kvagent.errors import ConfigError

MODES = ("auto", "eager", "static", "compiled", "graph")

# Why a forward ran eager, one code each (session stats, `kvagent inspect`, serve's /metrics).
EAGER_REASONS = {
    "mode": "--decode-step eager, or an architecture without a static step",
    "prefill": "a chunk of more than one token (prefill, a tool output, a re-prefill rebuild)",
    "private": "a cache outside the slot pools (dense, fractional budget, adaptive heads)",
    "mixed_block": "decode rows from different pool blocks or pools in one forward",
    "outgrown": "a layer outside its slot, or full, or a window ring of its own",
}

log = logging.getLogger("kvagent")
_RUNNERS = itertools.count()


def check_mode(mode: str) -> None:
    """A name of a mode (whether it runs on this machine is `resolve_mode`'s question)."""
    if mode not in MODES:
        raise ConfigError(f"decode_step: got {mode!r}; choose {', '.join(MODES)}")


def resolve_mode(mode: str, device: torch.device) -> str:
    """The mode `mode` runs as on `device`; called by execution.resolve alone."""
    check_mode(mode)
    if mode == "auto":
        return "graph" if device.type == "cuda" else "static"
    if mode == "graph" and device.type != "cuda":
        raise ConfigError("decode_step: graph needs CUDA; use static or compiled on a CPU")
    return mode


def batch_sizes(block_slots: int) -> list[int]:
    """1, 2, 4, ... below the block's size, then the size itself: the static batches of a block."""
    sizes, b = [], 1
    while b < block_slots:
        sizes.append(b)
        b *= 2
    return [*sizes, block_slots]


class StaticBatch:
    """The static buffers of one (pool block, B): inputs, views of the first B slots' slabs, and the
    function that runs on them (its CUDA graph once captured). Holds the block's tensors through
    views only, never the block, so a block dropped from its pool frees everything."""

    # staging rows: ids, pos, wpos, ridx, order, then one row of entry counts per layer
    IDS, POS, WPOS, RIDX, ORDER, LENS = range(6)

    def __init__(self, fn, device: torch.device, block, first: int, size: int, caps: tuple[int, ...]) -> None:
        n_layers = len(caps)
        self.first, self.size = first, size
        self.window = block.ring.shape[3] - 1
        pin = device.type == "cuda"
        self.host = torch.empty((self.LENS + n_layers, size), dtype=torch.long, pin_memory=pin)
        # An empty row: token 0 at position 0, recorded as -1, written to the scratch column of every
        # layer (C_l) and of the ring (W); its order entry 0. Made once, copied in at every fill.
        empty = [0, 0, -1, self.window, 0, *caps]
        self.empty = torch.tensor(empty, dtype=torch.long)[:, None].expand(-1, size).numpy().copy()
        self.inputs = torch.empty((self.LENS + n_layers, size), dtype=torch.long, device=device)
        self.host.numpy()[:] = self.empty
        self.inputs.copy_(self.host)  # a capture's warm-up and the graph see empty rows, never garbage
        self.args = (
            self.inputs[self.IDS],
            self.inputs[self.POS],
            self.inputs[self.WPOS],
            self.inputs[self.LENS :],
            self.inputs[self.RIDX],
            [k[first : first + size] for k in block.keys],
            [v[first : first + size] for v in block.values],
            [p[first : first + size] for p in block.positions],
            block.ring[first : first + size],
        )
        self.fn = fn
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None  # the graph's output buffer
        self.copied = torch.cuda.Event() if pin else None  # the last copy out of `host` is done

    def fill(self, rows: dict[int, tuple[int, int, list[int], int]], order: list[int]) -> None:
        """rows: row (slot index - first) -> (token id, position, per-layer entry count, ring index);
        order: the row of each chunk, in the forward's order (the logits rows it takes)."""
        if self.copied is not None:
            self.copied.synchronize()  # the previous step's copy may still read the staging rows
        h = self.host.numpy()
        h[:] = self.empty  # every row empty (scratch column, position -1) until a session fills it
        for slot, (token, position, lens, ring_index) in rows.items():
            h[self.IDS, slot], h[self.POS, slot], h[self.WPOS, slot] = token, position, position
            h[self.RIDX, slot] = ring_index
            h[self.LENS :, slot] = lens
        h[self.ORDER, : len(order)] = order
        self.inputs.copy_(self.host, non_blocking=True)
        if self.copied is not None:
            self.copied.record()

    def order(self, n: int) -> torch.Tensor:
        return self.inputs[self.ORDER, :n]

    def run(self) -> torch.Tensor:
        if self.graph is None:
            return self.fn(*self.args)
        self.graph.replay()
        return self.logits


class StepRunner:
    """One per engine (and decode mode): plans each forward, prepares each block's static batches."""

    def __init__(self, engine) -> None:
        self.device = engine.device
        self.mode = engine.execution.decode_step  # resolved once (execution.py)
        self.key = next(_RUNNERS)  # a block's batches are per runner (set_decode_step makes another)
        self.enabled = self.mode != "eager" and engine.decoder is not None
        # What the step runs: the engine's model path (over its packed weights where it packs them,
        # linear.py), except compiled, which cannot trace a packed weight.
        self.decoder = engine.model_path if self.mode != "compiled" else engine.decoder
        if self.enabled and self.mode == "graph":
            self.decoder.compile_parts()  # norms, RoPE, activation: one kernel each in the graph
        # One compiled function for every batch: it compiles once per B.
        self.compiled = None
        if self.enabled and self.mode == "compiled":
            self.compiled = torch.compile(self.decoder.__call__, fullgraph=True, dynamic=False)
        self.fn = self.compiled or self.decoder
        self.max_slots = engine.max_batch
        self.steps = 0  # forwards the static step ran (tests, benchmarks, /metrics)
        self.eager = Counter()  # forwards run eager, by reason (EAGER_REASONS)
        self.captures = 0
        self.capture_s = 0.0  # seconds spent preparing batches (captures, compiles), outside steps
        self.capture_failures = 0
        self.capture_each_s: list[float] = []  # each capture's seconds (the first compiles the parts)
        self._failure_logged = False
        self._graph_pool = None
        self._lock = threading.Lock()  # one prepare at a time (a capture is not reentrant)

    # ----------------------------------------------------------------- which forwards
    def plan(self, chunks) -> tuple:
        """((block, B), None) when the static step takes these chunks, else (None, the reason)."""
        if not self.enabled:
            return None, "mode"
        if any(len(c.ids) != 1 for c in chunks):
            return None, "prefill"
        first = chunks[0].cache.slot
        if first is None or first.block.ring is None:
            return None, "private"
        pool, block = first.pool, first.block
        top, low = 0, pool.block_slots
        for c in chunks:
            slot = c.cache.slot
            if slot is None:
                return None, "private"
            if slot.pool is not pool or slot.block is not block:
                return None, "mixed_block"
            if not _fits(c.cache, slot, pool.capacities):
                return None, "outgrown"
            top, low = max(top, slot.index + 1), min(low, slot.index)
        first, size = self.rows(low, top, pool.block_slots)
        return (pool, block, first, size), None

    def rows(self, low: int, top: int, block_slots: int) -> tuple[int, int]:
        """(first slot, B) covering slots low..top-1. Captured graphs start at slot 0, so a block's
        graphs are one per B and all made up front (on a GPU an empty row costs next to nothing);
        the other modes start at the B-aligned slot, so a session stepping alone computes with B = 1
        in whichever slot it holds (its numbers do not depend on where it lives: a session restored
        into another slot continues bit for bit; on a CPU an empty row costs its compute)."""
        for b in batch_sizes(block_slots):
            first = 0 if self.mode == "graph" else min(low // b * b, block_slots - b)
            if first + b >= top:
                return first, b
        return 0, block_slots

    def count_eager(self, reason: str, chunks) -> None:
        self.eager[reason] += 1
        for c in chunks:
            c.route = reason

    # ----------------------------------------------------------------- the step
    def batch(self, pool, block, first: int, size: int) -> StaticBatch:
        batch = block.batches.get((self.key, first, size))
        if batch is None:  # a block prepared by another runner, or a first slot not made up front
            self.prepare(pool, block)
            with self._lock:  # buffers and views only: no capture or compile (those start at 0)
                batch = block.batches.get((self.key, first, size))
                if batch is None:
                    batch = StaticBatch(self.fn, self.device, block, first, size, pool.capacities)
                    block.batches[(self.key, first, size)] = batch
        return batch

    def run(self, chunks, plan) -> None:
        pool, block, first, size = plan
        batch = self.batch(pool, block, first, size)
        rows = {}
        for c in chunks:
            cache = c.cache
            cache.current_positions = c.positions
            row = cache.slot.index - first
            rows[row] = (c.ids[0], c.first, [layer.n for layer in cache.layers], cache.ring_head)
        order = [c.cache.slot.index - first for c in chunks]
        batch.fill(rows, order)
        logits = batch.run()
        picked = logits.index_select(0, batch.order(len(chunks)))  # a copy: the buffer is reused
        positions = batch.inputs[StaticBatch.POS]
        for i, c in enumerate(chunks):
            row = c.cache.slot.index - first
            c.cache.stepped(c.first, positions[row : row + 1])
            c.logits = picked[i : i + 1]
            c.route = "static"
        self.steps += 1

    # ----------------------------------------------------------------- preparing a block
    @torch.no_grad()  # as the forwards run (a compiled step's guards include the grad mode)
    def prepare(self, pool, block) -> None:
        """Make every static batch of `block` (B = 1, 2, 4, ..., its size) before anything steps in
        it: compiled for each B, or captured in a CUDA graph for each B. Idempotent; a session calls
        it when it takes a slot (`Engine.slot_for`), so no capture or compile falls inside a step."""
        if not self.enabled or block.ring is None:
            return
        with self._lock:
            t0 = time.perf_counter()
            for size in batch_sizes(pool.block_slots):
                if (self.key, 0, size) in block.batches:
                    continue
                batch = StaticBatch(self.fn, self.device, block, 0, size, pool.capacities)
                if self.mode == "graph":
                    self._capture(batch)
                elif self.mode == "compiled":
                    batch.run()  # compiles this B now; empty rows write only scratch columns
                block.batches[(self.key, 0, size)] = batch
            self.capture_s += time.perf_counter() - t0

    def _capture(self, batch: StaticBatch) -> None:
        """A CUDA graph of the batch's step (warmed up on a side stream first), in the runner's one
        memory pool; on failure the batch keeps running uncaptured."""
        t0 = time.perf_counter()
        try:
            if self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                batch.fn(*batch.args)  # warm-up: kernels chosen, workspaces allocated outside the graph
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._graph_pool, capture_error_mode="thread_local"):
                out = batch.fn(*batch.args)
            batch.graph, batch.logits = graph, out
            self.captures += 1
            self.capture_each_s.append(time.perf_counter() - t0)
        except Exception as e:  # a capture error must never fail a request: run uncaptured
            self.capture_failures += 1
            batch.graph = batch.logits = None
            if not self._failure_logged:
                self._failure_logged = True
                log.warning("CUDA graph capture failed (B=%d), running uncaptured: %s", batch.size, e)


def _fits(cache, slot, caps) -> bool:
    """Every layer in its slot with room for one more entry, and the ring the slot's own."""
    if not cache.record or cache.ring is None or cache.ring.data_ptr() != slot.ring().data_ptr():
        return False
    for layer, cap in zip(cache.layers, caps, strict=True):
        if not layer.in_slot or layer.n >= cap:
            return False
    return True
