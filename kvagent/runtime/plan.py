"""A session's prepared plan: what the sessions of one CacheConfig on one engine run by, built once
per configuration (`Engine.plan`; kvpress builds a press once and passes it around) and handed to
every session of it (`Engine.session`, which gives it to the session's `Evictor`) and to the checks
before a run (`budget.check_run`), which so validate a run without opening a session or taking a
pool slot.

It holds the config, its policy (`config.build_policy` with the engine's model facts) and its
`Schedule` (when rounds come). Preparing it makes the checks a session would make first: the
policy's options and the budget against the model's context and the policy's block."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvagent.runtime.budget import check_budget
from kvagent.runtime.config import CacheConfig, build_policy
from kvagent.runtime.policies.base import BasePolicy
from kvagent.runtime.schedule import Schedule


@dataclass(frozen=True)
class CachePlan:
    config: CacheConfig
    policy: BasePolicy
    schedule: Schedule

    @classmethod
    def prepare(
        cls,
        config: CacheConfig,
        n_layers: int = 1,
        model_facts: Mapping[str, Any] | None = None,
        max_context: int | None = None,
    ) -> CachePlan:
        """The plan of `config` on a model of `n_layers` layers, `model_facts` and context limit
        (a test double's engine: none); raises the ConfigError a session of it would."""
        policy = build_policy(config, model_facts)
        check_budget(config, policy, max_context)
        return cls(config, policy, Schedule(config, policy, n_layers))

    @property
    def n_layers(self) -> int:
        return self.schedule.n_layers
