"""The eviction cadence (`CacheConfig.cadence`): under per-layer budgets (PyramidKV) each layer's
trigger K_l + 2r falls at a different token, so by default ("layer") a forward stops at whichever
comes next and prefill runs a few tokens at a time; "shared" cuts every layer over K_l + r as soon
as one is due, so the layers stay in one phase. Both must be exact (the masked-attention oracle),
keep every layer within K_l + 2r, and coincide where all layers keep one K."""

from __future__ import annotations

import pytest
import torch

from kvagent.errors import ConfigError
from kvagent.runspec import RunSpec
from kvagent.runtime import CacheConfig
from kvagent.runtime.budget import first_round, prompt_fit_problem
from kvagent.runtime.oracle import check_session_against_oracle, random_episode, trace
from kvagent.runtime.policies import make_policy

from .batching import assert_same_logits_and_kept, run_alone, run_together

TOL = 1e-4
# Two layers of the tiny model: K = [105, 35] (window 16 kept by each, the rest split 89 / 19),
# triggers at 137 and 67 with r = 16: 9 and 3 past a multiple of r, so out of phase.
PYRAMID = dict(policy="pyramidkv", budget=70, buffer=16, protect="sink", policy_args={"min_budget": 35})


def _pyramid(cadence: str, **over) -> CacheConfig:
    return CacheConfig(**{**PYRAMID, "cadence": cadence, **over})


def _record_loads(session) -> list[list[int]]:
    """Every layer's load whenever the session asks for a round (before each forward, so after the
    one before it); the caller adds the loads after the last forward."""
    seen: list[list[int]] = []
    ev = session.evictor
    inner = ev.evict_due

    def spy(*args, **kwargs):
        seen.append(list(ev.cache.loads()))
        return inner(*args, **kwargs)

    ev.evict_due = spy
    return seen


def test_the_tiny_pyramid_is_out_of_phase(tiny_engines):
    session = tiny_engines["qwen3"].session(_pyramid("layer"))
    assert session.evictor.layer_budgets(0) == [105, 35]


@pytest.mark.parametrize("framework", ["recent-buffer", "topk-all"])
@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_shared_cadence_matches_masked_full_attention(tiny_engines, framework, kind):
    session = tiny_engines[kind].session(_pyramid("shared", framework=framework, audit=True))
    with trace(session) as records:
        random_episode(session, vocab=512, turns=4)
    assert session.stats.rounds > 2, "the episode must evict"
    assert check_session_against_oracle(session, records) < TOL


def test_a_long_prefill_runs_one_round_per_r_tokens(tiny_engines):
    """600 prompt tokens: the default cadence steps through them in chunks of a few tokens (a
    round at each layer's trigger), the shared one in chunks of r; both hold each layer within
    K_l + 2r and leave it at K_l + r after its rounds."""
    prompt = torch.randint(0, 512, (600,), generator=torch.Generator().manual_seed(3)).tolist()
    rounds, peaks = {}, {}
    for cadence in ("layer", "shared"):
        session = tiny_engines["qwen3"].session(_pyramid(cadence))
        loads = _record_loads(session)
        session.append(prompt)
        loads.append(list(session.evictor.cache.loads()))
        rounds[cadence] = session.stats.rounds
        peaks[cadence] = [max(col) for col in zip(*loads, strict=True)]
        assert peaks[cadence] == [105 + 32, 35 + 32]  # reached, never passed
    # First round at 67 (the smaller layer's trigger), then one every 16 tokens.
    assert rounds["shared"] == (600 - 67) // 16 + 1
    assert rounds["layer"] > 1.5 * rounds["shared"]


def test_shared_cuts_every_layer_over_k_plus_r_at_each_round(tiny_engines):
    session = tiny_engines["qwen3"].session(_pyramid("shared", audit=True))
    random_episode(session, vocab=512, turns=5)
    by_round: dict[int, dict[int, int]] = {}
    for rec in session.audit:
        by_round.setdefault(rec.round, {})[rec.layer] = int((rec.kept[0] >= 0).sum())
    budgets = session.evictor.layer_budgets(0)
    both = [r for r in by_round.values() if len(r) == 2]
    assert len(both) >= 3, "once both layers hold more than K + r they must cut together"
    for held in both:
        assert held == {0: budgets[0] + 16, 1: budgets[1] + 16}


@pytest.mark.parametrize("policy", ["snapkv", "h2o"])
def test_cadences_coincide_where_layers_share_one_k(tiny_engines, policy):
    kept, logits = {}, {}
    for cadence in ("layer", "shared"):
        cfg = CacheConfig(policy=policy, budget=64, buffer=16, protect="sink", cadence=cadence, audit=True)
        session = tiny_engines["llama"].session(cfg)
        with trace(session) as records:
            random_episode(session, vocab=512, turns=3)
        kept[cadence] = [(a.round, a.layer, a.kept.tolist()) for a in session.audit]
        logits[cadence] = torch.cat([r.logits for r in records if r.logits is not None])
    assert kept["layer"] == kept["shared"]
    assert torch.equal(logits["layer"], logits["shared"])


def _agent_turns(session, seed: int) -> list[torch.Tensor]:
    """Observations and decode runs whose lengths differ per seed, so sessions batch out of step."""
    g = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(0, 512, (n,), generator=g).tolist()  # noqa: E731
    logits = [session.append(ids(40 + 9 * seed), all_logits=True)]
    for turn in range(4):
        logits.extend(session.step(t) for t in ids(12 + seed))
        logits.append(session.append(ids(50 + 7 * turn), all_logits=True))
    return logits


def test_shared_pyramid_sessions_batched_equal_solo(tiny_engines, batch_engines):
    cfgs = [_pyramid("shared", audit=True, seed=i) for i in range(3)]
    alone = run_alone(tiny_engines["qwen3"], cfgs, _agent_turns)
    sessions, together, records = run_together(batch_engines["qwen3"], cfgs, _agent_turns)
    for (solo, solo_logits), batched, batched_logits, rec in zip(
        alone, sessions, together, records, strict=True
    ):
        assert_same_logits_and_kept(solo, solo_logits, batched, batched_logits, TOL)
        assert [a.kept.tolist() for a in batched.audit] == [a.kept.tolist() for a in solo.audit]
        assert batched.stats.rounds == solo.stats.rounds > 2
        assert check_session_against_oracle(batched, rec) < TOL


def test_shared_rounds_start_at_the_first_trigger_and_the_prompt_check_holds():
    """Under shared a layer's first round is the first trigger of any layer, or later if it does
    not yet hold more than K + r. The smallest layer triggers first under both cadences and its K is
    the least at any later round, so whether a prompt fits is the same under both."""
    cfg = _pyramid("shared", protect="prompt")
    policy = make_policy("pyramidkv", min_budget=35, window=16)
    assert [first_round(cfg, policy, 2, 30, li) for li in (0, 1)] == [105 + 16 + 1, 35 + 32]
    assert [first_round(_pyramid("layer"), policy, 2, 30, li) for li in (0, 1)] == [105 + 32, 35 + 32]
    for budget, args in ((70, {"min_budget": 35}), (0.5, {"min_budget": 1}), (0.3, {"beta": 4.0})):
        both = [CacheConfig(**{**PYRAMID, "budget": budget, "protect": "prompt", "policy_args": args}, cadence=c)
                for c in ("layer", "shared")]  # fmt: skip
        verdicts = [[prompt_fit_problem(c, p, n_layers=2) is None for p in range(1, 300, 7)] for c in both]
        assert verdicts[0] == verdicts[1] and True in verdicts[0] and False in verdicts[0]


def test_bad_cadence_is_one_line():
    with pytest.raises(ConfigError, match=r"^cadence: got 'phase'; choose one of layer, shared$"):
        CacheConfig(policy="pyramidkv", budget=64, cadence="phase")


def test_the_cadence_is_part_of_what_a_run_is():
    """Never merged into the layer run, even for a policy with one K for all layers: a block policy
    (nexus) or adaptive heads leave layers holding different counts, and then shared cuts earlier."""
    spec = RunSpec(policy="snapkv", budget=64, cadence="shared")
    assert spec != RunSpec(policy="snapkv", budget=64) and spec.label.endswith("__cadence-shared")
    assert RunSpec.from_record({k: v for k, v in spec.record().items() if k != "cadence"}).cadence == "layer"


def test_shared_differs_where_one_k_leaves_layers_apart(tiny_engines):
    """Nexus keeps whole blocks, so a protected prompt that ends inside a block leaves layers a few
    entries apart: their triggers differ although K does not, and shared cuts the laggards early
    (fewer rounds, other keep-sets), still exactly."""
    ids = torch.randint(0, 512, (700,), generator=torch.Generator().manual_seed(0)).tolist()
    kept, rounds = {}, {}
    for cadence in ("layer", "shared"):
        cfg = CacheConfig(policy="nexus", budget=64, buffer=16, protect="prompt", policy_args={"block": 8},
                          cadence=cadence, audit=True)  # fmt: skip
        session = tiny_engines["qwen3"].session(cfg)
        with trace(session) as records:
            session.append(ids[:28])  # 3.5 blocks
            for t in ids[28:300]:
                session.step(t)
            session.append(ids[300:])
        assert check_session_against_oracle(session, records) < TOL
        kept[cadence] = [a.kept.tolist() for a in session.audit]
        rounds[cadence] = session.stats.rounds
    assert kept["layer"] != kept["shared"]
    assert rounds["shared"] < rounds["layer"]
