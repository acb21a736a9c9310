"""The Schedule is the one home of when rounds come: what the evictor asks while running (`room`,
`due`, `capacities`) agrees with what the checks ask before a run (`first_round`), for token and
fractional budgets, both frameworks and both cadences, on layers with different K."""

from __future__ import annotations

import pytest

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
