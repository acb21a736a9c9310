"""Eviction is correct iff the compacted cache gives the logits of full attention with exactly the
evicted (layer, head, position) entries masked out."""

import pytest
import torch

from kvagent.runtime import CacheConfig
from kvagent.runtime.oracle import check_session_against_oracle, trace

TOL = 1e-4


def run_episode(session, seed=0, turns=4):
    """A multi-turn episode: a prompt, then decode runs (step) and observation chunks (append)."""
    g = torch.Generator().manual_seed(seed)
    session.append(torch.randint(0, 512, (24,), generator=g).tolist(), all_logits=True)
    for t in range(turns):
        for tok in torch.randint(0, 512, (15 + 5 * t,), generator=g).tolist():
            session.step(tok)
        session.append(torch.randint(0, 512, (30 + 17 * t,), generator=g).tolist(), all_logits=True)


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("scope", ["prefill", "prefill+decode"])
@pytest.mark.parametrize("budget", [40, 64, 0.5])
def test_random_eviction_matches_masked_full_attention(tiny_engines, kind, scope, budget):
    engine = tiny_engines[kind]
    cfg = CacheConfig(policy="random", budget=budget, buffer=16, scope=scope, protect="sink", seed=3)
    session = engine.session(cfg)
    with trace(session) as records:
        run_episode(session)
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
        run_episode(session, turns=2)
    assert session.stats.rounds == 0
    assert check_session_against_oracle(session, records) < TOL
