"""The Schedule is the one home of when rounds come: what the evictor asks while running (`room`,
`due`, `capacities`) agrees with what the checks ask before a run (`first_round`), for token and
fractional budgets, both frameworks and both cadences, on layers with different K."""

from __future__ import annotations

import pytest
import torch

from kvagent.runtime import CacheConfig
from kvagent.runtime.schedule import NO_ROUND, Schedule

N_LAYERS = 4
CONFIGS = [
    CacheConfig(policy=p, budget=b, buffer=16, framework=f, cadence=c)
    for p in ("snapkv", "pyramidkv")
    for b in (256, 0.3)
    for f in ("recent-buffer", "topk-all")
    for c in ("layer", "shared")
]


def _first_due(schedule: Schedule, layer: int) -> int | None:
    """Grow a cache one token at a time (every layer holds the logical length until its first
    round) and say when `layer` is first among the layers due."""
    for n in range(1, 4096):
        if layer in schedule.due(n, [n] * N_LAYERS):
            return n
    return None


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.policy}-{c.budget}-{c.framework}-{c.cadence}")
def test_the_first_round_the_checks_predict_is_the_one_the_evictor_runs(config):
    schedule = Schedule.of(config, N_LAYERS)
    for layer in range(N_LAYERS):
        assert schedule.first_round(prompt_length=8, layer=layer) == _first_due(schedule, layer)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.policy}-{c.budget}-{c.framework}-{c.cadence}")
def test_the_room_before_a_round_ends_at_the_first_trigger(config):
    schedule = Schedule.of(config, N_LAYERS)
    first = min(_first_due(schedule, layer) for layer in range(N_LAYERS))
    assert schedule.room(first, [first] * N_LAYERS) <= 0 < schedule.room(first - 1, [first - 1] * N_LAYERS)
    if isinstance(config.budget, int):  # a slot holds a layer's trigger: K + 2r, or K + r under topk-all
        ks = schedule.layer_budgets(0)
        extra = 2 * config.buffer if config.framework == "recent-buffer" else config.buffer
        assert schedule.capacities() == tuple(k + extra for k in ks)
        assert schedule.room(first, [first] * N_LAYERS) == 0


def test_a_fractional_k_is_that_share_of_the_logical_length_at_least_one_token():
    schedule = Schedule.of(CacheConfig(policy="snapkv", budget=0.25), 1)
    assert [schedule.tokens(n) for n in (0, 3, 4, 1000)] == [1, 1, 1, 250]
    assert Schedule.of(CacheConfig(policy="snapkv", budget=0.25), 1).capacities() is None


def test_a_dense_cache_has_no_round():
    schedule = Schedule.of(CacheConfig(), N_LAYERS)
    assert schedule.room(10**6, []) == NO_ROUND and schedule.capacities() is None


def test_a_reprefill_rebuild_cuts_every_layer_over_what_a_round_leaves():
    schedule = Schedule.of(CacheConfig(policy="snapkv", budget=256, buffer=16), 2)
    # K + r = 272 left by a round, K + 2r = 288 the trigger
    assert schedule.due(300, [280, 275]) == []
    assert schedule.due(300, [280, 275], to_budget=True) == [0, 1]
    assert schedule.due(300, [288, 272], to_budget=True) == [0]


@pytest.mark.parametrize("framework", ["recent-buffer", "topk-all"])
def test_a_session_sizes_its_layers_to_the_trigger(qwen3_engine, framework):
    """What the evictor allocates is the Schedule's trigger (K_l + 2r, K_l + r under topk-all),
    before any round (a token budget's buffers) and after one (a fraction's private buffers)."""
    r = 16
    extra = 2 * r if framework == "recent-buffer" else r
    ids = torch.randint(0, 512, (400,), generator=torch.Generator().manual_seed(0)).tolist()
    fixed = qwen3_engine.session(
        CacheConfig(policy="pyramidkv", budget=128, buffer=r, framework=framework, protect="sink")
    )
    ks = fixed.evictor.layer_budgets(0)
    assert [layer.capacity_hint for layer in fixed.cache.layers] == [k + extra for k in ks]
    frac = CacheConfig(
        policy="pyramidkv", budget=0.3, buffer=r, framework=framework, mode="reprefill", protect="sink"
    )
    s = qwen3_engine.session(frac)
    s.append(ids)  # the rebuild is cut to what a round leaves in buffers of the trigger's size
    ks = s.evictor.layer_budgets(s.logical_length)
    assert [layer.keys.shape[-2] for layer in s.cache.layers] == [k + extra for k in ks]
