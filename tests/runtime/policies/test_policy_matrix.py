"""Every registered policy through the real runtime, on both tiny GQA models (Qwen3, Llama), in both
modes and both eviction frameworks: the logits must equal full attention with exactly the evicted
entries masked out.

The matrix enumerates the registry, so a new policy fails here until it has a case below."""

import pytest

from kvagent.runtime import CacheConfig
from kvagent.runtime.oracle import check_session_against_oracle, random_episode, trace
from kvagent.runtime.policies import available

TOL = 1e-4

# Knobs sized for K=64 on the tiny models (blocks of 8; recent windows well below K).
CASES = {
    "full": {},
    "streaming": {},
    "random": {},
    "snapkv": {},
    "pyramidkv": {"min_budget": 32},
    "h2o": {},
    "nexus": {"block": 8},
    "tova": {},
    "knorm": {},
    "keydiff": {},
    "rkv": {},
    "triattention": {"rope_theta": 10_000.0, "recent": 16},  # the tiny models' RoPE base
    "morphkv": {},
    "vase": {},
    "segments": {},  # no marks here: its scorer's (snapkv's); marked segments: test_segments.py
}


def test_every_registered_policy_has_a_case():
    assert sorted(CASES) == available()


def _segments(records):
    """Reprefill rebuilds the cache from position 0 at every append: each rebuild and the decode
    steps after it are one independent computation, checked against its own reference."""
    out = []
    for rec in records:
        if rec.start == 0 or not out:
            out.append([])
        out[-1].append(rec)
    return out


@pytest.mark.parametrize("framework", ["recent-buffer", "topk-all"])
@pytest.mark.parametrize("mode", ["persistent", "reprefill"])
@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("policy", sorted(CASES))
def test_policy_matches_masked_full_attention(tiny_engines, policy, kind, mode, framework):
    engine = tiny_engines[kind]
    assert engine.model.config.rope_parameters["rope_theta"] == 10_000.0  # what CASES assumes
    cfg = CacheConfig(policy=policy, budget=64, buffer=16, protect="sink", mode=mode, seed=5,
                      policy_args=CASES[policy], framework=framework)  # fmt: skip
    session = engine.session(cfg)
    static_before = engine.step_runner.steps
    with trace(session) as records:
        random_episode(session, vocab=512, turns=3)
    if policy != "full":
        assert session.stats.rounds > 2, "the episode must actually evict"
        # decode_step "auto" is static on a CPU: the oracle checks the static step's cache too
        assert engine.step_runner.steps > static_before, "the static step must carry the decode steps"
    segments = _segments(records) if mode == "reprefill" else [records]
    if mode == "reprefill" and policy != "full":
        assert len(segments) == 4  # the prompt and three observation appends
    worst = max(check_session_against_oracle(session, seg) for seg in segments)
    assert worst < TOL
