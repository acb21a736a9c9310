"""Policies take what they need from the model (BasePolicy.model_args <- Engine.model_facts):
TriAttention gets the model's own RoPE frequencies without the user copying rope_theta."""

from __future__ import annotations

import warnings

import pytest
import torch

from kvagent.runtime import CacheConfig, Engine
from kvagent.runtime.config import build_policy
from kvagent.runtime.models import tiny_random_model
from kvagent.runtime.policies.base import model_defaults
from kvagent.runtime.policies.triattention import rope_frequencies

THETA = 10_000.0  # the tiny models' RoPE base


class Ids:
    """The smallest tokenizer an Engine over a built model needs (ids are fed directly)."""

    eos_token_id = None

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def engine_for(**overrides) -> Engine:
    return Engine.load(tiny_random_model("qwen3", vocab_size=128, **overrides), tokenizer=Ids(), device="cpu")


def kept_after(engine, ids, **policy_args):
    cfg = CacheConfig(policy="triattention", budget=48, buffer=16, protect="sink", policy_args=policy_args)
    s = engine.session(cfg)
    s.append(ids)
    return s, [p.clone() for p in s.kept_positions()]


def ids(n=160):
    return torch.randint(0, 128, (n,), generator=torch.Generator().manual_seed(3)).tolist()


def test_the_engine_reads_the_rope_frequencies_the_model_rotates_with():
    engine = engine_for()
    assert torch.allclose(engine.model_facts["inv_freq"].float(), rope_frequencies(THETA, 16).float())


def test_a_session_fills_them_in_so_triattention_needs_no_policy_args():
    engine = engine_for()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="triattention")  # the no-RoPE fallback must not run
        s, kept = kept_after(engine, ids())
    assert s.policy.inv_freq is not None and s.stats.rounds > 0
    _, by_theta = kept_after(engine, ids(), rope_theta=THETA)
    assert all(torch.equal(a, b) for a, b in zip(kept, by_theta, strict=True))
    # ...and it matters: the no-trig fallback keeps a different set.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the fallback's warning is what is asked for here
        _, by_norms = kept_after(engine, ids(), rope_theta=None, inv_freq=None)
    assert not all(torch.equal(a, b) for a, b in zip(kept, by_norms, strict=True))


def test_an_explicit_rope_theta_wins_and_other_policies_get_nothing():
    engine = engine_for()
    s, _ = kept_after(engine, ids(64), rope_theta=500.0)
    assert s.policy._frequencies(_view_like(16)).allclose(rope_frequencies(500.0, 16))
    assert model_defaults("snapkv", engine.model_facts, {}) == {}
    assert engine.session(CacheConfig(policy="snapkv", budget=48, buffer=16)).policy is not None


def test_one_function_builds_a_configs_policy_for_the_session_and_the_checks():
    engine = engine_for()
    assert build_policy(CacheConfig(policy="pyramidkv", budget=64, window=8)).window == 8  # the config's
    told = CacheConfig(policy="pyramidkv", budget=64, window=8, policy_args={"window": 4})
    assert build_policy(told).window == 4 == engine.session(told).policy.window  # policy_args win
    tri = CacheConfig(policy="triattention", budget=48)
    assert build_policy(tri).inv_freq is None  # a check before the engine loads: no model facts
    assert torch.equal(build_policy(tri, engine.model_facts).inv_freq, engine.session(tri).policy.inv_freq)


def test_scaled_rope_yarn_gives_the_scaled_frequencies():
    yarn = {
        "rope_type": "yarn",
        "rope_theta": THETA,
        "factor": 4.0,
        "original_max_position_embeddings": 16384,
    }
    engine = engine_for(rope_parameters=yarn)
    facts = engine.model_facts["inv_freq"]
    assert torch.equal(facts, engine.model.model.rotary_emb.inv_freq.double())
    assert not torch.allclose(facts, rope_frequencies(THETA, 16))  # YaRN stretched the low ones


def test_frequencies_that_do_not_fit_the_head_are_an_error():
    engine = engine_for()
    s = engine.session(CacheConfig(policy="triattention", budget=48, buffer=16, protect="sink"))
    s.policy.inv_freq = torch.ones(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="partial rotary"):
        s.append(ids())


def _view_like(head_dim):
    class V:
        keys = torch.zeros(1, 1, 1, head_dim)

    return V()
