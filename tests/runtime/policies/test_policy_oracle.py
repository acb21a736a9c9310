"""Every policy through the real runtime: the compacted cache must give the logits of full
attention with exactly the evicted (layer, head, position) entries masked out."""

import pytest

from kvagent.runtime import CacheConfig
from kvagent.runtime.audit import analyse
from kvagent.runtime.oracle import check_session_against_oracle, random_episode, trace

TOL = 1e-4

CASES = {
    "streaming": {},
    "random": {},
    "random-shared": {"shared": True},
    "snapkv": {},
    "pyramidkv": {"min_budget": 32},
    "h2o": {},
    "nexus": {"block": 8},
    "nexus-A-Res-nowalk": {"block": 8, "n": 1, "lam": 0.0},
}


@pytest.mark.parametrize("protect", ["sink", "prompt"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_policy_matches_masked_full_attention(tiny_qwen3_engine, case, protect):
    name = case.split("-")[0]
    cfg = CacheConfig(
        policy=name, budget=64, buffer=16, protect=protect, seed=5, policy_args=CASES[case], audit=True
    )
    session = tiny_qwen3_engine.session(cfg)
    with trace(session) as records:
        random_episode(session, vocab=512, turns=3)
    assert session.stats.rounds > 2, "the episode must actually evict"
    assert check_session_against_oracle(session, records) < TOL
    kept = session.kept_positions()
    if name == "nexus" or CASES[case].get("shared"):
        assert all((k == k[:, :1]).all() for k in kept)  # one keep-set per layer
    report = analyse(session.audit)
    assert report["n_rounds"] == len(session.audit) > 0
    if protect == "prompt":
        assert report["prompt_survival"]["union"] == 1.0
    gain = report["coverage"]["gain"]
    if case == "random":
        assert gain > 1.05  # independent per-head draws cover more positions than one head
    if name == "nexus" or case == "random-shared":
        assert gain == pytest.approx(1.0)
