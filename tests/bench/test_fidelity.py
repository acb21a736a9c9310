import pytest

from kvagent.bench import replay as rp
from kvagent.bench.episodes import from_messages
from kvagent.bench.stream import build_stream
from kvagent.runtime import CacheConfig


@pytest.fixture(scope="module")
def stream(tiny_engine, episode_record):
    ep = from_messages("fixture", episode_record(turns=6)["messages"])
    return build_stream(ep, tiny_engine.tokenizer)


@pytest.fixture(scope="module")
def reference(tiny_engine, stream):
    return rp.reference_run(tiny_engine, stream)


def _mean(xs):
    return sum(xs) / len(xs)


def test_full_against_full_is_exactly_identical(tiny_engine, stream, reference):
    res = rp.policy_run(tiny_engine, stream, CacheConfig(policy="full"), reference.reference)
    assert len(res.kl) == stream.n_scored > 50
    assert max(res.kl) == 0.0
    assert all(res.agree)
    assert res.logp_true == reference.logp_true
    assert res.probe_logp == reference.probe_logp and res.probe_text == reference.probe_text


@pytest.mark.parametrize("mode", ["persistent", "reprefill"])
def test_budget_as_large_as_the_context_changes_nothing(tiny_engine, stream, reference, mode):
    cfg = CacheConfig(policy="random", budget=len(stream.ids) + 64, buffer=32, mode=mode)
    res = rp.policy_run(tiny_engine, stream, cfg, reference.reference)
    assert res.stats["rounds"] == 0
    assert max(res.kl) < 1e-6
    assert all(res.agree)


@pytest.mark.parametrize("mode", ["persistent", "reprefill"])
def test_tiny_budget_is_measurably_worse(tiny_engine, stream, reference, mode):
    k = stream.prompt_length + 16
    res = rp.policy_run(
        tiny_engine, stream, CacheConfig(policy="random", budget=k, buffer=16, mode=mode), reference.reference
    )
    assert res.stats["rounds"] > 3
    assert _mean(res.kl) > 1e-3
    assert _mean([float(a) for a in res.agree]) < 0.99
    assert isinstance(res.probe_retrieved, bool) and res.probe_logp is not None


def test_compare_kl_is_positive_for_a_different_distribution(reference):
    import torch

    ref = reference.reference
    logits = torch.zeros(ref.ids.shape[0] and 151_680)
    kl, _, _ = rp.compare(ref, logits, 0, 0)
    assert kl > 0.1
