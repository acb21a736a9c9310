"""head_budget=adaptive (Ada-KV): heads of a layer keep different counts, K x H_kv in all, in
per-head buffers (no padding to the widest head); the compacted cache still gives the logits of
full attention with exactly the evicted entries masked out, in both modes and when batched."""

from __future__ import annotations

import pytest
import torch

from kvagent.errors import ConfigError
from kvagent.runtime import CacheConfig
from kvagent.runtime.oracle import ForwardRecord, check_session_against_oracle, random_episode, trace

from .batching import assert_same_logits_and_kept, run_alone, run_together

VOCAB = 512
TOL = 1e-4
K, R = 48, 16

POLICIES = {
    "snapkv": {},
    "pyramidkv": {"min_budget": 32},
    "h2o": {},
    "tova": {"shared": False},
    "rkv": {},
}


def config(policy: str, mode: str = "persistent", seed: int = 5, **kw) -> CacheConfig:
    return CacheConfig(
        policy=policy,
        budget=K,
        buffer=R,
        protect="sink",
        mode=mode,
        seed=seed,
        policy_args=POLICIES[policy],
        head_budget="adaptive",
        audit=True,
        **kw,
    )


def row_bytes(engine) -> int:
    item = torch.empty((), dtype=engine.dtype).element_size()
    return 2 * engine.head_dim * item + 8  # key + value + position


def assert_adaptive_rounds(session) -> None:
    """Every round kept K_l x H_kv entries in all (plus every head's recent buffer under the
    recent-buffer framework), and some head kept a different count."""
    recent_buffer = session.config.recent_buffer
    budgets = [k + recent_buffer for k in session.evictor.layer_budgets(session.logical_length)]
    h = session.engine.n_kv_heads
    rounds = [r for r in session.audit if not r.forced]
    assert rounds
    uneven = False
    for r in rounds:
        counts = (r.kept >= 0).sum(dim=-1)
        assert int(counts.sum()) == budgets[r.layer] * h
        uneven |= bool((counts != counts[0]).any())
    assert uneven, "adaptive allocation should give heads different counts"


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_adaptive_persistent_matches_masked_full_attention(tiny_engines, kind, policy):
    engine = tiny_engines[kind]
    session = engine.session(config(policy))
    with trace(session) as records:
        random_episode(session, vocab=VOCAB, turns=3)
        # Recent enough that every head holds them, in either framework.
        gone = range(session.logical_length - 20, session.logical_length - 5)
        session.forget(gone)
        for t in range(10):
            session.step(t)
    assert session.stats.rounds > 2
    assert check_session_against_oracle(session, records) < TOL
    assert_adaptive_rounds(session)
    assert session.stats.forgotten > 0
    for layer in session.kept_positions():
        assert not ((layer >= gone.start) & (layer < gone.stop)).any()


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_adaptive_reprefill_matches_masked_full_attention(tiny_engines, kind, policy):
    """After a reprefill (dense over the history, then one adaptive round to K x H_kv), decode
    steps attend exactly the kept entries; the memory held is sum_h (count_h + r) rows."""
    engine = tiny_engines[kind]
    session = engine.session(config(policy, mode="reprefill"))
    g = torch.Generator().manual_seed(3)
    session.append(torch.randint(0, VOCAB, (30,), generator=g).tolist())
    for t in torch.randint(0, VOCAB, (20,), generator=g).tolist():
        session.step(t)
    obs = torch.randint(0, VOCAB, (60,), generator=g).tolist()
    logits = session.append(obs, all_logits=True)
    recent_buffer = session.config.recent_buffer  # each head's, kept beside its share of K x H_kv
    budgets = [k + recent_buffer for k in session.evictor.layer_budgets(session.logical_length)]
    h = engine.n_kv_heads
    for layer, k in zip(session.cache.layers, budgets, strict=True):
        assert sum(layer.counts) == k * h
        assert layer.nbytes() == (k * h + h * R) * row_bytes(engine)  # no padding to the widest head
    assert any(len(set(layer.counts)) > 1 for layer in session.cache.layers)
    first = ForwardRecord(0, list(session.history), [torch.empty((0, 0))] * engine.n_layers, logits)
    with trace(session) as records:
        for t in torch.randint(0, VOCAB, (12,), generator=g).tolist():
            session.step(t)
    assert check_session_against_oracle(session, [first, *records]) < TOL


def test_uniform_layout_pads_nothing_either(qwen3_engine):
    """The same total as the uniform layout: H_kv x (K + 2r) rows per layer after a round (K + r
    under topk-all)."""
    uni = qwen3_engine.session(
        CacheConfig(policy="snapkv", budget=K, buffer=R, protect="sink", mode="reprefill")
    )
    ada = qwen3_engine.session(config("snapkv", mode="reprefill"))
    for s in (uni, ada):
        s.append(list(range(200)))
    assert uni.stats.kv_bytes == ada.stats.kv_bytes
    # some head holds more than K (+ the recent buffer), others fewer
    assert ada.stats.max_entries > K + ada.config.recent_buffer


@pytest.mark.parametrize("policy", ["random", "nexus", "streaming", "knorm"])
def test_policies_without_comparable_scores_refuse_adaptive(policy):
    with pytest.raises(ConfigError, match="^head_budget: adaptive needs") as err:
        CacheConfig(policy=policy, budget=64, head_budget="adaptive")
    assert "\n" not in str(err.value)


def test_head_budget_is_validated():
    with pytest.raises(ConfigError, match="^head_budget: got 'ada'; choose one of uniform, adaptive"):
        CacheConfig(policy="snapkv", budget=64, head_budget="ada")
    with pytest.raises(ConfigError, match="shared=false"):
        CacheConfig(policy="tova", budget=64, head_budget="adaptive")
    CacheConfig(policy="full", head_budget="adaptive")  # nothing to allocate: accepted


def test_adaptive_sessions_batched_with_others_equal_solo(tiny_engines, batch_engines):
    solo_engine, engine = tiny_engines["llama"], batch_engines["llama"]
    cfgs = [
        config("snapkv", seed=0),
        config("h2o", seed=1, mode="reprefill"),
        CacheConfig(policy="snapkv", budget=K, buffer=R, protect="sink", seed=2),
        CacheConfig(policy="snapkv", budget=K, buffer=R, protect="sink", seed=3),
        CacheConfig(seed=4),
    ]

    def run(session, seed):
        g = torch.Generator().manual_seed(seed)
        out = [session.append(torch.randint(0, VOCAB, (20 + seed,), generator=g).tolist())]
        for _ in range(3):
            out += [session.step(t) for t in torch.randint(0, VOCAB, (25,), generator=g).tolist()]
            out.append(session.append(torch.randint(0, VOCAB, (30,), generator=g).tolist(), all_logits=True))
        return out

    alone = run_alone(solo_engine, cfgs, run)
    sessions, results, _ = run_together(engine, cfgs, run, traced=False)
    assert sessions[0].evictor.slot is None and sessions[2].evictor.slot is not None
    for (s0, r0), s1, r1 in zip(alone, sessions, results, strict=True):
        assert_same_logits_and_kept(s0, r0, s1, r1, TOL)
    assert sessions[0].stats.rounds > 1
    assert engine.batcher.rows > engine.batcher.forwards


def test_cli_threads_head_budget_into_the_cache_config():
    from kvagent.cli.settings import cache_args
    from kvagent.options import cache_config

    # A command's parameters: cache options among others (cache_args picks the CacheConfig fields).
    params = {
        "policy": "snapkv",
        "budget": "64",
        "protect": "sink",
        "head_budget": "adaptive",
        "max_steps": 3,
    }
    assert cache_config(**cache_args(params)).head_budget == "adaptive"
    with pytest.raises(ConfigError, match="^head_budget: adaptive needs"):
        cache_config(**cache_args({**params, "policy": "random"}))
