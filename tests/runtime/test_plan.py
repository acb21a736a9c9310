"""One prepared plan per configuration (plan.py): opening a session the way `kvagent solve` does
(the config, `check_run`, the session, its first append) builds the policy once, makes one
Schedule, and opens no session but the real one; the plan's sessions share it."""

import sys

import pytest

from kvagent.errors import ConfigError
from kvagent.runtime import schedule, session
from kvagent.runtime.budget import check_run
from kvagent.runtime.config import CacheConfig
from kvagent.runtime.policies import base


def _counted(fn):
    """What `fn()` returned and how often make_policy, Schedule and Session ran inside it."""
    names = {
        base.make_policy.__code__: "make_policy",
        schedule.Schedule.__init__.__code__: "Schedule",
        session.Session.__init__.__code__: "Session",
    }
    counts = dict.fromkeys(names.values(), 0)

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in names:
            counts[names[frame.f_code]] += 1

    old = sys.getprofile()
    sys.setprofile(profile)
    try:
        out = fn()
    finally:
        sys.setprofile(old)
    return out, counts


def test_one_session_builds_one_policy_and_one_schedule(qwen3_engine):
    def open_one():
        config = CacheConfig(policy="snapkv", budget=64, seed=551)  # a seed no other test plans
        check_run(qwen3_engine, config, 40)
        s = qwen3_engine.session(config)
        s.append(list(range(40)))
        return s

    s, counts = _counted(open_one)
    assert counts == {"make_policy": 1, "Schedule": 1, "Session": 1}
    assert s.stats.logical_length == 40


def test_sessions_of_one_configuration_share_its_plan(qwen3_engine):
    config = CacheConfig(policy="snapkv", budget=64, seed=552)
    plan = qwen3_engine.plan(config)
    again = CacheConfig(policy="snapkv", budget=64, seed=552)  # an equal config, another object
    (a, b), counts = _counted(lambda: (qwen3_engine.session(config), qwen3_engine.session(again)))
    assert counts == {"make_policy": 0, "Schedule": 0, "Session": 2}
    assert a.evictor.schedule is b.evictor.schedule is plan.schedule and a.policy is plan.policy
    assert qwen3_engine.plan(CacheConfig(policy="snapkv", budget=64, seed=553)) is not plan


def test_check_run_refuses_what_a_session_would_without_taking_a_slot(qwen3_engine):
    with pytest.raises(ConfigError, match="context limit"):
        check_run(qwen3_engine, CacheConfig(policy="random", budget=10**9, seed=554))
    config = CacheConfig(policy="snapkv", budget=72, buffer=24, seed=555)  # capacities no other test has
    check_run(qwen3_engine, config, 40)
    caps = qwen3_engine.plan(config).schedule.capacities()
    assert not any(key[0] == caps for key in qwen3_engine.pools)  # no pool made, no slot taken
