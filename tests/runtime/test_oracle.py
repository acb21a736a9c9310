"""Eviction is correct iff the compacted cache gives the logits of full attention with exactly the
evicted (layer, head, position) entries masked out."""

import pytest

from kvagent.runtime import CacheConfig
from kvagent.runtime.oracle import check_session_against_oracle, random_episode, trace

TOL = 1e-4


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("scope", ["prefill", "prefill+decode"])
@pytest.mark.parametrize("budget", [40, 64, 0.5])
def test_random_eviction_matches_masked_full_attention(tiny_engines, kind, scope, budget):
    engine = tiny_engines[kind]
    cfg = CacheConfig(policy="random", budget=budget, buffer=16, scope=scope, protect="sink", seed=3)
    session = engine.session(cfg)
    with trace(session) as records:
        random_episode(session, vocab=512, turns=4)
    assert session.stats.rounds > 2, "the episode must actually evict"
    assert check_session_against_oracle(session, records) < TOL


def test_oracle_detects_a_wrong_cache(qwen3_engine):
    """The oracle must be able to fail: corrupt one kept entry and the logits diverge."""
    session = qwen3_engine.session(CacheConfig(policy="random", budget=40, buffer=16, protect="sink"))
    with trace(session) as records:
        session.append(list(range(100)), all_logits=True)
        layer = session.cache.layers[1]
        layer.positions[0, 0, 10] += 1  # claims a different token than the one whose K/V it holds
        for tok in range(20):
            session.step(tok)
    assert check_session_against_oracle(session, records) > 1e-2


def test_dense_session_matches_plain_forward(qwen3_engine):
    session = qwen3_engine.session(CacheConfig())
    with trace(session) as records:
        random_episode(session, vocab=512, turns=2)
    assert session.stats.rounds == 0
    assert check_session_against_oracle(session, records) < TOL
