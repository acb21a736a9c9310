"""Batched sessions equal solo sessions: concurrent episodes on an engine with max_batch > 1 give,
per session, the logits, kept positions and greedy ids of the same episode run alone, and the
compacted caches still match the masked-attention oracle."""

from __future__ import annotations

import gc

import pytest
import torch

from kvagent.errors import ConfigError
from kvagent.runtime import CacheConfig, Engine, Sampling
from kvagent.runtime.oracle import check_session_against_oracle
from kvagent.runtime.policies import available, make_policy

from .batching import assert_same_logits_and_kept, run_alone, run_together

VOCAB = 512
TOL = 1e-4


def rand_ids(n: int, g: torch.Generator) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


def episode(session, seed: int) -> dict:
    """Every API call an agent makes, with shapes that differ per seed so that some sessions
    prefill while others decode."""
    g = torch.Generator().manual_seed(seed)
    logits, ids = [], []
    logits.append(session.append(rand_ids(12 + 3 * seed, g), all_logits=True))
    for turn in range(3):
        gen = session.generate(10 + 2 * seed + turn, sampling=Sampling())
        ids.append(gen.ids)
        logits.append(session.last_logits.clone())
        logits.append(session.append(rand_ids(20 + 7 * turn + seed, g)))
        logits.append(session.teacher_force(rand_ids(6 + seed, g)))
        logits.extend(session.step(t) for t in rand_ids(5, g))
    return {"logits": logits, "ids": ids}


def configs(policy: str, n_layers: int) -> list[CacheConfig]:
    """Different budgets, buffers, modes, scopes, protections, seeds and both eviction frameworks;
    several share a pool (same capacity), so their decode steps form batched attention runs."""
    block = make_policy(policy).block
    k = block * max(1, -(-48 // block))
    r16, r8 = (block * max(1, -(-r // block)) for r in (16, 8))  # recent-buffer: whole blocks

    def protect(budget: int, seed: int) -> str:
        # `prompt` only where the prompt (12 + 3 * seed tokens) leaves something to evict.
        smallest = min(make_policy(policy).layer_budgets(budget, n_layers))
        return "prompt" if 12 + 3 * seed + 4 < smallest else "sink"

    rb, old = "recent-buffer", "topk-all"
    shapes = [
        (k, r16, "persistent", "prefill+decode", rb),
        (k, r16, "persistent", "prefill+decode", rb),
        (k, r16, "reprefill", "prefill+decode", rb),
        (k, r16, "persistent", "prefill", rb),  # decode may outgrow the slot, then come back
        (2 * k, r8, "persistent", "prefill+decode", rb),
        (0.5, r16, "persistent", "prefill+decode", rb),  # fractional: a private cache
        (k, 16, "persistent", "prefill+decode", old),
        (k, 16, "persistent", "prefill+decode", old),
    ]
    out = [
        CacheConfig(
            policy=policy,
            budget=b,
            buffer=r,
            mode=mode,
            scope=scope,
            seed=i,
            protect=protect(b, i) if isinstance(b, int) else "sink",
            audit=True,
            framework=framework,
        )
        for i, (b, r, mode, scope, framework) in enumerate(shapes)
    ]
    out.append(CacheConfig(seed=len(out)))  # a dense session rides along
    return out


def assert_same(solo_session, solo, batched_session, batched):
    assert batched["ids"] == solo["ids"]
    assert len(batched["logits"]) == len(solo["logits"])
    assert_same_logits_and_kept(solo_session, solo["logits"], batched_session, batched["logits"], TOL)
    assert batched_session.stats.rounds == solo_session.stats.rounds
    if solo_session.audit is not None:
        assert [r.kept.tolist() for r in batched_session.audit] == [
            r.kept.tolist() for r in solo_session.audit
        ]


# Every policy on both models, VaSE included: its sampling weights sit on a grid (vase.grid_weights),
# so last-bit differences of a batched forward no longer reorder its sample.
BATCH_CASES = [(policy, kind) for kind in ("qwen3", "llama") for policy in available()]


@pytest.mark.parametrize(("policy", "kind"), BATCH_CASES)
def test_concurrent_sessions_equal_solo_runs(tiny_engines, batch_engines, kind, policy):
    solo_engine, engine = tiny_engines[kind], batch_engines[kind]
    cfgs = configs(policy, solo_engine.n_layers)
    alone = run_alone(solo_engine, cfgs, episode)
    sched = engine.batcher
    forwards, rows, widest = sched.forwards, sched.rows, sched.widest_run
    sessions, together, records = run_together(engine, cfgs, episode)
    for (s0, r0), s1, r1 in zip(alone, sessions, together, strict=True):
        assert_same(s0, r0, s1, r1)
    if policy != "full":
        assert any(s.stats.rounds > 1 for s in sessions), "the episodes must evict"
    # Forwards were really shared, and some attention ran as one batched run over a pool block.
    assert (sched.rows - rows) > 1.5 * (sched.forwards - forwards)
    if policy != "full":
        assert sched.widest_run >= 2 or widest >= 2
    for s, rec in zip(sessions, records, strict=True):
        if rec is not None:
            assert check_session_against_oracle(s, rec) < TOL


def test_batched_decode_run_matches_solo_with_unequal_lengths(tiny_engines, batch_engines):
    """Three sessions in one pool, lengths a few entries apart: one masked run per step."""
    solo_engine, engine = tiny_engines["qwen3"], batch_engines["qwen3"]
    cfgs = [CacheConfig(policy="snapkv", budget=40, buffer=16, protect="sink", seed=i) for i in range(3)]
    alone = run_alone(solo_engine, cfgs, episode)
    sched = engine.batcher
    sched.widest_run = 0
    sessions, together, _ = run_together(engine, cfgs, episode, traced=False)
    for (s0, r0), s1, r1 in zip(alone, sessions, together, strict=True):
        assert_same(s0, r0, s1, r1)
    assert sched.widest_run == 3


def test_slots_are_reused_and_evicting_sessions_live_in_their_slot(batch_engines):
    engine = batch_engines["qwen3"]
    cfg = CacheConfig(policy="streaming", budget=24, buffer=8, protect="sink")
    s = engine.session(cfg)
    pool = s.evictor.slot.pool
    assert pool.capacities == (24 + 2 * 8,) * engine.n_layers  # K + 2r: the recent-buffer framework's peak
    old = engine.session(
        CacheConfig(policy="streaming", budget=24, buffer=8, protect="sink", framework="topk-all")
    )
    assert old.evictor.slot.pool.capacities == (24 + 8,) * engine.n_layers
    used = pool.in_use
    s.append(list(range(40)))
    assert all(layer.in_slot for layer in s.cache.layers)
    assert s.stats.kv_bytes == [pool.slot_nbytes() // engine.n_layers] * engine.n_layers
    del s
    gc.collect()
    assert pool.in_use == used - 1
    again = engine.session(cfg)
    assert again.evictor.slot.pool is pool and pool.in_use == used


def test_max_batch_must_be_a_positive_int(qwen3_engine):
    with pytest.raises(ConfigError, match="max_batch"):
        Engine.load(qwen3_engine.model, tokenizer=qwen3_engine.tokenizer, device="cpu", max_batch=0)
    assert qwen3_engine.batcher is None and qwen3_engine.max_batch == 1


def test_a_failing_forward_reaches_its_caller_and_the_engine_keeps_serving(batch_engines):
    engine = batch_engines["qwen3"]
    s = engine.session(CacheConfig())
    with pytest.raises(IndexError):
        s.append([VOCAB + 10_000])  # out of the embedding's range
    ok = engine.session(CacheConfig())
    assert ok.append([1, 2, 3]).shape == (VOCAB,)
