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


def _pair(tiny_engines, kind="qwen3", max_batch=1):
    """An eager and a static engine over identical weights."""
    base = tiny_engines[kind]
    out = {}
    for mode in ("eager", "static"):
        model = copy.deepcopy(base.model)
        out[mode] = Engine.load(
            model, tokenizer=base.tokenizer, device="cpu", decode_step=mode, max_batch=max_batch
        )
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


@pytest.mark.parametrize("fields", CONFIGS, ids=lambda f: f"{f['policy']}-{f.get('mode', 'persistent')}")
def test_static_step_equals_eager_over_300_steps(tiny_engines, fields):
    engines = _pair(tiny_engines)
    runs = {}
    for mode, engine in engines.items():
        s = engine.session(CacheConfig(**fields))
        runs[mode] = (s, _script(s, seed=7))
    (e_s, e_logits), (s_s, s_logits) = runs["eager"], runs["static"]
    assert engines["eager"].step_runner.steps == 0
    assert engines["static"].step_runner.steps > STEPS // 2  # the static step really carried decode
    assert e_s.stats.rounds == s_s.stats.rounds > 5
    for a, b in zip(e_logits, s_logits, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    for a, b in zip(e_s.kept_positions(), s_s.kept_positions(), strict=True):
        assert torch.equal(a, b)


def test_sessions_joining_and_leaving_a_static_batch_equal_eager_solo_runs(tiny_engines):
    solo = _pair(tiny_engines)["eager"]
    batched = _pair(tiny_engines, max_batch=4)["static"]
    cfg = CacheConfig(policy="snapkv", budget=24, buffer=8, protect="sink")
    plans = [(0, 120), (15, 60), (30, 140), (45, 40), (70, 90)]  # (steps to wait, steps to run)
    alone = []
    for i, (_, n) in enumerate(plans):
        s = solo.session(cfg)
        alone.append(_steps(s, i, n))
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
            results[i] = _steps(s, i, n)
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
    assert batched.step_runner.steps > 0 and batched.scheduler.rows > batched.scheduler.forwards
    for a, b in zip(alone, results, strict=True):
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-5)


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


def test_a_pool_left_empty_gives_its_memory_back(tiny_engines):
    """Solo engines make a pool per budget: once its last session is gone the slabs are freed, and
    the static batches over them are dropped when the next one is made."""
    import gc

    engine = _pair(tiny_engines)["static"]
    cfg = CacheConfig(policy="random", budget=24, buffer=8, protect="sink")
    s = engine.session(cfg)
    pool = s.evictor.slot.pool
    s.append(list(range(1, 41)))
    s.step(3)
    assert pool.nbytes() > 0 and len(engine.step_runner.batches) == 1
    del s
    gc.collect()
    assert pool.nbytes() == 0 and pool.in_use == 0
    again = engine.session(cfg)
    again.append(list(range(1, 41)))
    again.step(3)
    [batch] = engine.step_runner.batches.values()
    assert batch.block is pool.blocks[0] and again.evictor.slot.pool is pool


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
    runner, sched = batched.step_runner, batched.scheduler
    steps0, forwards0, rows0 = runner.steps, sched.forwards, sched.rows
    threads = [threading.Thread(target=lambda s=s: [s.step(t) for t in toks[:40]]) for s in (b, c)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert runner.steps - steps0 == sched.forwards - forwards0 and sched.rows - rows0 == 80
    assert sched.rows - rows0 > sched.forwards - forwards0  # some forwards held both
    batched.close()
