"""The static decode step (runtime/step.py, decoder.py): the same numbers as the eager forward, the
same shapes every step, and compiled once.

The oracle matrix (test_oracle.py, policies/test_policy_oracle.py) and the batched-equals-solo
matrix (test_batch.py) run through the static step too: `decode_step="auto"` is `static` on a CPU,
and test_oracle asserts the step ran."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kvagent.errors import ConfigError
from kvagent.runtime import CacheConfig, Engine
from kvagent.runtime.step import StaticBatch

STEPS = 300


def _pair(tiny_engines, kind="qwen3", max_batch=1, attention="auto"):
    """An eager and a static engine over identical weights; `attention`: the static step's backend
    (split: 8 keys a chunk, so a tiny slab still splits into several)."""
    base = tiny_engines[kind]
    out = {}
    for mode in ("eager", "static"):
        model = copy.deepcopy(base.model)
        out[mode] = Engine.load(
            model, tokenizer=base.tokenizer, device="cpu", decode_step=mode, max_batch=max_batch
        )
    static = out["static"]
    static.set_step_attention(attention, kv_chunk=8)
    static.set_decode_step("static")  # its step (the packed twin) made again with that backend
    assert static.step_runner.decoder.attention == ("sdpa" if attention == "auto" else attention)
    return out


def _script(s, seed: int) -> list[torch.Tensor]:
    """300 decode steps with rounds, a forget, a rewind and appends between them: every logits row."""
    gen = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(1, 500, (n,), generator=gen).tolist()  # noqa: E731
    out = [s.append(ids(40))]
    for t in range(STEPS):
        out.append(s.step(ids(1)[0]))
        if t == 90:
            s.forget([5, 6, 7, s.logical_length - 3])  # leaves heads ragged where they held them
        if t == 150:
            s.rewind(4)
            out.append(s.append(ids(9)))
        if t == 220:
            out.append(s.append(ids(30)))  # a prefill chunk through the same slabs
    return out


CONFIGS = [
    dict(policy="random", budget=24, buffer=8, protect="sink"),
    dict(policy="snapkv", budget=24, buffer=8, protect="sink", framework="topk-all"),
    dict(policy="h2o", budget=24, buffer=8, protect="sink"),  # pending queries, per-entry state
    dict(policy="nexus", budget=64, buffer=32, protect="sink"),  # block selection
    dict(policy="pyramidkv", budget=32, buffer=8, protect="sink"),  # a K per layer
    dict(policy="streaming", budget=24, buffer=8, protect="sink", mode="reprefill"),
]


@pytest.mark.parametrize("attention", ["sdpa", "split"])
@pytest.mark.parametrize("fields", CONFIGS, ids=lambda f: f"{f['policy']}-{f.get('mode', 'persistent')}")
def test_static_step_equals_eager_over_300_steps(tiny_engines, fields, attention):
    """Both static attention backends (attention_step.py) against the eager forward: rounds, a
    forget (ragged heads), a rewind and prefill chunks between the steps."""
    engines = _pair(tiny_engines, attention=attention)
    runs = {}
    for mode, engine in engines.items():
        s = engine.session(CacheConfig(**fields))
        runs[mode] = (s, _script(s, seed=7))
    (e_s, e_logits), (s_s, s_logits) = runs["eager"], runs["static"]
    assert engines["eager"].step_runner.steps == 0
    assert engines["static"].step_runner.steps > STEPS // 2  # the static step really carried decode
    assert e_s.stats.rounds == s_s.stats.rounds > 5
    # Each session's stats say how its forwards ran: eager ones with their reason.
    assert set(e_s.stats.forwards) == {"mode"}
    routes = s_s.stats.forwards
    assert routes["static"] > STEPS // 2 and routes["prefill"] >= 3
    assert sum(routes.values()) == sum(e_s.stats.forwards.values())
    for a, b in zip(e_logits, s_logits, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    for a, b in zip(e_s.kept_positions(), s_s.kept_positions(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("attention", ["sdpa", "split"])
def test_sessions_joining_and_leaving_a_static_batch_equal_eager_solo_runs(tiny_engines, attention):
    solo = _pair(tiny_engines)["eager"]
    batched = _pair(tiny_engines, max_batch=4, attention=attention)["static"]
    cfg = CacheConfig(policy="snapkv", budget=24, buffer=8, protect="sink")
    plans = [(0, 120), (15, 60), (30, 140), (45, 40), (70, 90)]  # (steps to wait, steps to run)
    alone = []
    for i, (_, n) in enumerate(plans):
        s = solo.session(cfg)
        alone.append((_steps(s, i, n), s.kept_positions()))
    results: list = [None] * len(plans)
    errors: list = []
    # Joining late: a session starts after others took some steps; leaving: it stops and is freed.
    started = [threading.Event() for _ in plans]

    def drive(i):
        try:
            wait, n = plans[i]
            if i:
                started[i - 1].wait()
            s = batched.session(cfg)
            started[i].set()
            results[i] = (_steps(s, i, n), s.kept_positions())
            del s
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            for ev in started:
                ev.set()

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batched.close()
    assert not errors, errors
    assert batched.step_runner.steps > 0 and batched.batcher.rows > batched.batcher.forwards
    # Which sessions share a forward depends on thread timing, and with it the padded width and so
    # the float32 summation order: 1e-4 as in test_batcher (1e-5 failed once at 1.1e-5 in CI, on
    # logits of mean size ~1.2). One key dropped moves them by up to ~5; keep-sets match exactly.
    for (a, kept_a), (b, kept_b) in zip(alone, results, strict=True):
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(y, x, atol=1e-4, rtol=1e-4)
        for x, y in zip(kept_a, kept_b, strict=True):
            assert torch.equal(x, y)


def _steps(s, seed: int, n: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = [s.append(torch.randint(1, 500, (30,), generator=gen).tolist())]
    for _ in range(n):
        out.append(s.step(int(torch.randint(1, 500, (1,), generator=gen))))
    return out


class Recorder(TorchDispatchMode):
    """Every op a step dispatches, with its tensor arguments' shapes."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        shapes = tuple(
            (tuple(a.shape), str(a.device))
            for a in torch.utils._pytree.tree_leaves((args, kwargs))
            if isinstance(a, torch.Tensor)
        )
        self.ops.append((str(func), shapes))
        return func(*args, **(kwargs or {}))


def test_the_step_is_static(tiny_engines, monkeypatch):
    """For a fixed batch size: the same (op, shape) sequence every step, rounds and a forget between
    them; slab storage never moves; no value read back to the host inside a step."""
    engine = _pair(tiny_engines)["static"]
    s = engine.session(CacheConfig(policy="snapkv", budget=24, buffer=8, protect="sink"))
    s.append(list(range(1, 41)))
    steps: list[list[tuple]] = []
    original = StaticBatch.run

    def recorded(self):
        rec = Recorder()
        with rec:
            out = original(self)
        steps.append(rec.ops)
        return out

    monkeypatch.setattr(StaticBatch, "run", recorded)
    layer0 = s.cache.layers[0]
    ptrs = (layer0.keys.data_ptr(), layer0.values.data_ptr(), layer0.positions.data_ptr())
    rounds0 = s.stats.rounds
    for t in range(STEPS):
        s.step(1 + t % 400)
        if t == 100:
            s.forget([3, 20])
    assert s.stats.rounds - rounds0 >= STEPS // 8
    assert len(steps) == STEPS
    assert all(ops == steps[0] for ops in steps), "the step's ops or shapes changed between steps"
    names = {op for op, _ in steps[0]}
    assert not any("_local_scalar_dense" in n or n.startswith("aten.item") for n in names)
    assert not any(dev != "cpu" for _, shapes in steps[0] for _, dev in shapes)
    assert (layer0.keys.data_ptr(), layer0.values.data_ptr(), layer0.positions.data_ptr()) == ptrs
    assert layer0.in_slot


def test_compiled_step_compiles_once_and_matches(tiny_engines):
    """torch.compile(fullgraph=True, dynamic=False) of the step: 300 steps with rounds, no
    recompilation (error_on_recompile), the same logits as the eager forward over the same plain
    weights (a compiled engine does not pack them: runtime/linear.py)."""
    import torch._dynamo

    base = tiny_engines["qwen3"]
    eager = Engine.load(
        copy.deepcopy(base.model), tokenizer=base.tokenizer, device="cpu", decode_step="eager", linear="plain"
    )
    model = copy.deepcopy(tiny_engines["qwen3"].model)
    compiled = Engine.load(
        model, tokenizer=tiny_engines["qwen3"].tokenizer, device="cpu", decode_step="compiled"
    )
    cfg = CacheConfig(policy="random", budget=24, buffer=8, protect="sink")
    torch._dynamo.reset()
    old = torch._dynamo.config.error_on_recompile
    torch._dynamo.config.error_on_recompile = True
    try:
        out = {}
        for name, engine in (("eager", eager), ("compiled", compiled)):
            s = engine.session(cfg)
            gen = torch.Generator().manual_seed(3)
            rows = [s.append(torch.randint(1, 500, (40,), generator=gen).tolist())]
            for _ in range(STEPS):
                rows.append(s.step(int(torch.randint(1, 500, (1,), generator=gen))))
            out[name] = (s, rows)
    finally:
        torch._dynamo.config.error_on_recompile = old
    assert compiled.step_runner.steps == STEPS and out["compiled"][0].stats.rounds > 5
    for a, b in zip(out["eager"][1], out["compiled"][1], strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_compiled_parts_of_the_step_match_eager(tiny_engines):
    """RMSNorm, RoPE and the gated activation compiled (as the captured CUDA step has them): the
    static step still gives the eager forward's logits, through the compiled functions."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    engines = _pair(tiny_engines)
    decoder = engines["static"].step_runner.decoder
    decoder.compile_parts()
    assert decoder.parts_compiled and decoder.rms_norm is not decoder.rope
    torch._dynamo.reset()
    counters.clear()
    cfg = CacheConfig(policy="random", budget=24, buffer=8, protect="sink")
    out = {}
    for mode, engine in engines.items():
        s = engine.session(cfg)
        gen = torch.Generator().manual_seed(5)
        rows = [s.append(torch.randint(1, 500, (40,), generator=gen).tolist())]
        for _ in range(60):
            rows.append(s.step(int(torch.randint(1, 500, (1,), generator=gen))))
        out[mode] = (s, rows)
    assert engines["static"].step_runner.steps == 60 and out["static"][0].stats.rounds > 2
    assert counters["stats"]["unique_graphs"] >= 3  # the three parts really compiled
    for a, b in zip(out["eager"][1], out["static"][1], strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_decode_step_modes_are_checked(tiny_engines):
    base = tiny_engines["qwen3"]
    with pytest.raises(ConfigError, match="decode_step: got 'fast'"):
        Engine.load(base.model, tokenizer=base.tokenizer, device="cpu", decode_step="fast")
    with pytest.raises(ConfigError, match="graph needs CUDA"):
        Engine.load(base.model, tokenizer=base.tokenizer, device="cpu", decode_step="graph")


def test_a_block_and_its_static_batches_are_freed_without_the_garbage_collector(tiny_engines):
    """Once a block's last session is gone the pool drops it, and with it the static batches (and on
    CUDA the graphs) made over it: no reference cycle (a cache and its layers, a runner and its
    batches) and no batcher local keeps its slabs alive, so the memory is back before the next
    session of another budget runs a forward, with the collector off."""
    import gc
    import weakref

    engine = _pair(tiny_engines)["static"]
    cfg = CacheConfig(policy="random", budget=24, buffer=8, protect="sink")
    s = engine.session(cfg)
    pool = s.evictor.slot.pool
    s.append(list(range(1, 41)))
    s.step(3)
    block = pool.blocks[0]
    assert pool.nbytes() > 0 and len(block.batches) == 1
    dead = [weakref.ref(x) for x in (block, block.keys[0], *block.batches.values())]
    del block
    gc.collect()
    gc.disable()
    try:
        del s
        other = engine.session(CacheConfig(policy="snapkv", budget=32, buffer=8, protect="sink"))
        other.append(list(range(1, 41)))
        other.step(3)  # one forward of another block
        assert [r() for r in dead] == [None] * len(dead)
        assert pool.nbytes() == 0 and pool.in_use == 0
    finally:
        gc.enable()
    again = engine.session(cfg)
    again.append(list(range(1, 41)))
    again.step(3)
    assert again.evictor.slot.pool is pool and len(pool.blocks[0].batches) == 1


def test_a_batching_engines_scheduler_holds_no_finished_forward(tiny_engines):
    """The batcher thread keeps no chunk (its cache, its logits) of a forward it has served."""
    import gc
    import weakref

    engine = _pair(tiny_engines, max_batch=4)["static"]
    cfg = CacheConfig(policy="random", budget=24, buffer=8, protect="sink")
    s = engine.session(cfg)
    s.append(list(range(1, 41)))
    s.step(3)
    ref = weakref.ref(s.cache)
    gc.collect()
    gc.disable()
    try:
        del s
        assert ref() is None
    finally:
        gc.enable()
        engine.close()


def test_a_session_moves_into_a_slot_that_came_free_and_steps_the_same(tiny_engines):
    """Sessions scatter over pool blocks as others come and go (serve: a dropped conversation);
    at its next call a session moves into the lowest free slot, entries and window ring copied, so
    live sessions share one block (one static batch) and a block left empty gives its memory back.
    Its logits and keep-sets stay those of a solo eager session fed the same."""
    import gc

    solo = _pair(tiny_engines)["eager"]
    batched = _pair(tiny_engines, max_batch=2)["static"]
    cfg = CacheConfig(policy="snapkv", budget=24, buffer=8, protect="sink")  # records queries
    a, b, c = (batched.session(cfg) for _ in range(3))
    pool = c.evictor.slot.pool
    assert (c.evictor.slot.block_index, c.evictor.slot.index) == (1, 0) and len(pool.blocks) == 2
    ref = solo.session(cfg)
    gen = torch.Generator().manual_seed(11)
    prompt = torch.randint(1, 500, (40,), generator=gen).tolist()
    toks = torch.randint(1, 500, (120,), generator=gen).tolist()
    ours, theirs = [c.append(prompt)], [ref.append(prompt)]
    for t in toks[:50]:  # rounds fire in block 1
        ours.append(c.step(t))
        theirs.append(ref.step(t))
    before = c.stats.rounds
    del a
    gc.collect()
    for t in toks[50:]:
        ours.append(c.step(t))
        theirs.append(ref.step(t))
    assert (c.evictor.slot.block_index, c.evictor.slot.index) == (0, 0)
    assert len(pool.blocks) == 1 and pool.in_use == 2
    assert c.stats.rounds > before > 0
    keys, _, _ = c.evictor.slot.views(0)
    assert c.cache.layers[0].in_slot and c.cache.layers[0].keys.data_ptr() == keys.data_ptr()
    assert c.cache.ring.data_ptr() == c.evictor.slot.ring().data_ptr()
    for x, y in zip(theirs, ours, strict=True):
        torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-5)
    for x, y in zip(ref.kept_positions(), c.kept_positions(), strict=True):
        assert torch.equal(x, y)
    # Together in block 0, the two sessions' decode tokens take the static step in every forward.
    b.append(prompt)
    runner, sched = batched.step_runner, batched.batcher
    steps0, forwards0, rows0 = runner.steps, sched.forwards, sched.rows
    threads = [threading.Thread(target=lambda s=s: [s.step(t) for t in toks[:40]]) for s in (b, c)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert runner.steps - steps0 == sched.forwards - forwards0 and sched.rows - rows0 == 80
    assert sched.rows - rows0 > sched.forwards - forwards0  # some forwards held both
    batched.close()


class HostSyncs(TorchDispatchMode):
    """What would stall a GPU's host inside a step or a round: a value read back (`.item()`,
    `int(t)`, `.tolist()`), a tensor made from host data (on CUDA a pageable host-to-device copy),
    a boolean-mask index or `nonzero` (an output shape the host must wait for)."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        leaves = torch.utils._pytree.tree_leaves((args, kwargs))
        bool_index = name.startswith("aten.index.Tensor") and any(
            isinstance(a, torch.Tensor) and a.dtype == torch.bool for a in leaves[1:]
        )
        if "_local_scalar_dense" in name or "lift_fresh" in name or "nonzero" in name or bool_index:
            self.found.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("policy", ["random", "snapkv", "h2o"])
def test_no_host_sync_inside_a_step_or_a_round(tiny_engines, monkeypatch, policy):
    """A whole `StepRunner.run` (staging, step, bookkeeping) and a whole round (view, scores,
    selection, compaction) dispatch nothing that reads a value back to the host or copies host
    data in: on a GPU each would stall the host behind every kernel queued before it."""
    from kvagent.runtime.evictor import Evictor
    from kvagent.runtime.step import StepRunner

    engine = _pair(tiny_engines)["static"]
    s = engine.session(CacheConfig(policy=policy, budget=24, buffer=8, protect="sink"))
    s.append(list(range(1, 41)))
    seen = {"step": [], "round": []}

    def watch(kind, original):
        def wrapped(*args, **kwargs):
            rec = HostSyncs()
            with rec:
                out = original(*args, **kwargs)
            seen[kind].append(rec.found)
            return out

        return wrapped

    monkeypatch.setattr(StepRunner, "run", watch("step", StepRunner.run))
    monkeypatch.setattr(Evictor, "evict_due", watch("round", Evictor.evict_due))
    for t in range(60):
        s.step(1 + t)
    assert len(seen["step"]) == 60 and s.stats.rounds >= 4 and seen["round"]
    assert all(found == [] for found in seen["step"]), seen["step"][0]
    assert all(found == [] for found in seen["round"]), seen["round"][0]


def test_a_failed_capture_falls_back_to_the_uncaptured_step(tiny_engines, caplog):
    """A capture that fails (here: no CUDA at all) leaves each batch size on the uncaptured static
    step, counted and logged once; the forwards run, with the eager step's logits."""
    engines = _pair(tiny_engines)
    runner = engines["static"].step_runner
    runner.mode = "graph"  # the capture path, on a machine where it cannot succeed
    cfg = CacheConfig(policy="snapkv", budget=24, buffer=8, protect="sink")
    out = {}
    with caplog.at_level("WARNING", logger="kvagent"):
        for mode, engine in engines.items():
            s = engine.session(cfg)
            out[mode] = [s.append(list(range(1, 41)))] + [s.step(1 + t) for t in range(40)]
    assert runner.capture_failures == 1 and runner.captures == 0 and runner.steps == 40
    assert sum("capture failed" in r.message for r in caplog.records) == 1
    for a, b in zip(out["eager"], out["static"], strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
