"""What one run is, and its one label: the cache configuration that a sweep varies and the seed.

`kvagent eval` plans one per instance, `kvagent bench fidelity` one per episode, the report groups
finished runs by them, and file names, tables and progress lines all show `spec.label`:
`nexus__persistent__K1024`, `full__persistent__dense`, with `__prefill` / `__protect-sink` /
`__heads-adaptive` where scope, protect or the head budget differ from their defaults."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kvagent.runtime.config import CacheConfig

DEFAULT_SCOPE = "prefill+decode"
DEFAULT_PROTECT = "prompt"
# `full` never evicts, so its modes are one computation: run once in this mode, reuse for the others.
CANONICAL_DENSE_MODE = "persistent"


def budget_label(budget: int | float | None) -> str:
    return "dense" if budget is None else f"K{budget}"


@dataclass(frozen=True)
class RunSpec:
    policy: str
    mode: str = "persistent"
    scope: str = DEFAULT_SCOPE
    protect: str = DEFAULT_PROTECT
    budget: int | float | None = None
    buffer: int = 128
    window: int = 16
    seed: int = 0
    head_budget: str = "uniform"  # Ada-KV: "adaptive" gives heads different counts
    # The policy's options; part of what a run is, not of its label (nor of its hash).
    policy_args: dict[str, Any] = field(default_factory=dict, hash=False)

    @classmethod
    def of(cls, config: CacheConfig) -> RunSpec:
        return cls(
            policy=config.policy,
            mode=config.mode,
            scope=config.scope,
            protect=config.protect,
            budget=config.budget if config.evicts else None,
            buffer=config.buffer,
            window=config.window,
            seed=config.seed,
            head_budget=config.head_budget,
            policy_args=dict(config.policy_args),
        )

    @property
    def label(self) -> str:
        parts = [self.policy, self.mode, budget_label(self.budget)]
        return "__".join([*parts, *self.variant])

    @property
    def variant(self) -> list[str]:
        """What sets this run apart beyond policy, mode and budget (non-default scope, protect, head
        budget), as label parts."""
        parts = []
        if self.scope != DEFAULT_SCOPE:
            parts.append(self.scope)
        if self.protect != DEFAULT_PROTECT:
            parts.append(f"protect-{self.protect}")
        if self.head_budget != "uniform":
            parts.append(f"heads-{self.head_budget}")
        return parts

    @property
    def canonical(self) -> RunSpec:
        """The run whose result this one reuses (itself, except for dense runs in other modes)."""
        if self.policy == "full" and self.mode != CANONICAL_DENSE_MODE:
            return replace(self, mode=CANONICAL_DENSE_MODE)
        return self

    def cache_config(self, **options: Any) -> CacheConfig:
        """The session's CacheConfig (`options`: fields no sweep varies, e.g. audit=True)."""
        return CacheConfig(
            policy=self.policy,
            budget=self.budget,
            buffer=self.buffer,
            protect=self.protect,
            scope=self.scope,
            mode=self.mode,
            window=self.window,
            seed=self.seed,
            head_budget=self.head_budget,
            policy_args=dict(self.policy_args),
            **options,
        )

    def record(self) -> dict[str, Any]:
        """The spec's fields for a results file (policy_args only when there are any)."""
        d = asdict(self)
        if not d["policy_args"]:
            del d["policy_args"]
        return d


# A sweep's options are lists: its errors name the option (`modes: ...`), not the config field.
_SWEEP_OPTION = {"policy": "policies", "mode": "modes", "scope": "scopes", "budget": "budgets"}


def sweep(
    policies: Sequence[str],
    modes: Sequence[str],
    budgets: Sequence[int | float | None],
    seeds: Sequence[int] = (0,),
    *,
    scopes: Sequence[str] = (DEFAULT_SCOPE,),
    protects: Sequence[str] = (DEFAULT_PROTECT,),
    policy_args: dict[str, dict[str, Any]] | None = None,
    **fixed: Any,
) -> list[RunSpec]:
    """Every (seed, policy, mode, scope, budget, protect), `full` with no budget; each spec once and
    checked, so a bad value fails before any run starts. `fixed`: buffer, window, head_budget."""
    from kvagent.errors import ConfigError
    from kvagent.runtime.policies import make_policy

    args = policy_args or {}
    evicting = [b for b in budgets if b is not None]
    specs: list[RunSpec] = []
    for seed, policy, mode, scope in itertools.product(seeds, policies, modes, scopes):
        for budget, protect in itertools.product([None] if policy == "full" else evicting, protects):
            # A dense run has no heads to budget: one `full` run serves every head-budget setting.
            own = (
                {**fixed, "head_budget": "uniform"} if policy == "full" and "head_budget" in fixed else fixed
            )
            spec = RunSpec(policy, mode, scope, protect, budget, seed=seed, policy_args=dict(args.get(policy, {})),
                           **own)  # fmt: skip
            try:
                spec.cache_config()
            except ConfigError as e:
                name, _, rest = str(e).partition(":")
                raise ConfigError(f"{_SWEEP_OPTION.get(name, name)}:{rest}") from None
            specs.append(spec)
    for policy in dict.fromkeys(policies):
        make_policy(policy, **args.get(policy, {}))  # the policy's options are valid
    return list(dict.fromkeys(specs))
