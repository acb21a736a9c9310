"""What one run is, and its one label.

A run is a `CacheConfig` reduced to what identifies it: `RunSpec` IS that CacheConfig, with every
field but `HOW_NOT_WHICH` (settings of how a session runs, not of which run it is). So a field added
to CacheConfig is, with no other edit, part of every spec, of its results record (`record()`; read
back by `from_record`, where a record written before the field existed gets its default, or its
`LEGACY` value where the default changed meaning, so old records keep their meaning), of the
report's configurations and, when it differs from its baseline (the legacy value, else the default),
of the label.

`kvagent eval` plans one per instance, `kvagent bench fidelity` one per episode, the report groups
finished runs by their `configuration`, and file names, tables and progress lines all show
`spec.label`: `nexus__persistent__K1024__recent-buffer`, `full__persistent__dense`, then one part per
other setting that differs from its baseline: `__prefill` / `__protect-sink` / `__heads-adaptive`.
A run of the old eviction framework (topk-all) keeps the label it always had: no framework part."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, fields, replace
from typing import Any

from kvagent.runtime.config import CacheConfig

# CacheConfig fields that say how a session runs, not which run it is: never in a spec or a record
# (pass them to `RunSpec.cache_config`).
HOW_NOT_WHICH = ("audit", "prefill_chunk")
IDENTITY = tuple(f.name for f in fields(CacheConfig) if f.name not in HOW_NOT_WHICH)
DEFAULTS = {f.name: f.default if f.default is not MISSING else f.default_factory() for f in fields(CacheConfig)}  # type: ignore[misc]  # fmt: skip
DEFAULT_SCOPE, DEFAULT_PROTECT = DEFAULTS["scope"], DEFAULTS["protect"]
# What a record without the field ran with, where that is not today's default: records from before
# issue #26 ran the topk-all framework (recent-buffer is the default since). Also the label's
# baseline, so those runs keep their labels and resume, and a new default run never joins them.
LEGACY = {"framework": "topk-all"}
BASELINE = {**DEFAULTS, **LEGACY}
# The label is `<policy>__<mode>__<budget>`, then a part per other field that differs from its
# baseline: those named here first, spelled so, then any other as `<field>-<value>`. Never in it: the
# seed (run ids add `__s<seed>`) and what labels never showed (buffer, window, policy options), so
# the run directories on disk keep their labels and resume.
LABEL_PARTS = {"scope": "{}", "protect": "protect-{}", "head_budget": "heads-{}", "framework": "{}"}
LABEL_HEAD = ("policy", "mode", "budget")
NOT_IN_LABEL = ("seed", "buffer", "window", "policy_args")
# What a dense run (one that never evicts) keeps of its settings; the rest (the budget, how heads
# share it, the framework, ...) only eviction reads, so one dense run serves all their values, and
# they take their baseline (a dense record from before a field existed is the same run). Scope and
# protect stay because dense labels on disk show them.
DENSE_KEEPS = ("policy", "mode", "scope", "protect", "seed", "buffer", "window", "policy_args")
# `full` never evicts, so its modes are one computation: run once in this mode, reuse for the others.
CANONICAL_DENSE_MODE = "persistent"


def budget_label(budget: int | float | None) -> str:
    return "dense" if budget is None else f"K{budget}"


class RunSpec(CacheConfig):
    """One run: a CacheConfig whose how-settings (`HOW_NOT_WHICH`) are at their defaults, and a dense
    one without the settings only eviction reads. Hashable (the policy options are part of what a run
    is, not of its hash)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._settle()

    def _settle(self) -> None:
        for name in HOW_NOT_WHICH:
            object.__setattr__(self, name, DEFAULTS[name])
        if not self.evicts:
            for name in IDENTITY:
                if name not in DENSE_KEEPS:
                    object.__setattr__(self, name, BASELINE[name])

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, k) for k in IDENTITY if k != "policy_args"))

    @classmethod
    def of(cls, config: CacheConfig) -> RunSpec:
        return cls(**{**{k: getattr(config, k) for k in IDENTITY}, "policy_args": dict(config.policy_args)})

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> RunSpec:
        """The spec a results record was written from (`record()`, with any other fields around it);
        a field the record lacks or leaves empty has the value records written before it existed ran
        with (`LEGACY`, else its default). Read, not checked: a record says what ran, so one whose
        policy has left the registry since still reports. A float budget that is a whole number is
        tokens."""
        values = {k: record[k] for k in IDENTITY if k in record and (record[k] is not None or k == "budget")}
        values = {**LEGACY, **values}
        b = values.get("budget")
        if isinstance(b, float) and b.is_integer() and b >= 1:
            values["budget"] = int(b)
        return cls._unchecked(values)

    @classmethod
    def _unchecked(cls, values: Mapping[str, Any]) -> RunSpec:
        spec = cls.__new__(cls)
        for name, default in DEFAULTS.items():
            value = values.get(name, default)
            object.__setattr__(spec, name, dict(value) if isinstance(value, dict) else value)
        spec._settle()
        return spec

    def record(self) -> dict[str, Any]:
        """The spec's fields for a results file (policy_args only when there are any)."""
        rec = {k: getattr(self, k) for k in IDENTITY}
        rec["policy_args"] = dict(self.policy_args)
        if not rec["policy_args"]:
            del rec["policy_args"]
        return rec

    def cache_config(self, **options: Any) -> CacheConfig:
        """The session's CacheConfig (`options`: how-settings, e.g. audit=True)."""
        return CacheConfig(**{**self.record(), "policy_args": dict(self.policy_args), **options})

    @property
    def label(self) -> str:
        return "__".join([self.policy, self.mode, budget_label(self.budget), *self.variant])

    @property
    def varied(self) -> list[str]:
        """The fields that set this run apart beyond policy, mode and budget (shown in the label and
        different from their baseline), in label order."""
        order = [*LABEL_PARTS, *(k for k in IDENTITY if k not in LABEL_PARTS)]
        return [k for k in order if k not in (*LABEL_HEAD, *NOT_IN_LABEL) and getattr(self, k) != BASELINE[k]]

    @property
    def variant(self) -> list[str]:
        """The label parts of `varied`."""
        return [LABEL_PARTS.get(k, k.replace("_", "-") + "-{}").format(getattr(self, k)) for k in self.varied]

    @property
    def configuration(self) -> RunSpec:
        """What the report groups runs by: this spec with only what its label shows (the seed, buffer,
        window and policy options at their defaults)."""
        return self._unchecked({**self.record(), **{k: DEFAULTS[k] for k in NOT_IN_LABEL}})

    @property
    def canonical(self) -> RunSpec:
        """The run whose result this one reuses (itself, except for dense runs in other modes)."""
        if self.policy == "full" and self.mode != CANONICAL_DENSE_MODE:
            return replace(self, mode=CANONICAL_DENSE_MODE)
        return self


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
    policy_args: Mapping[str, Mapping[str, Any]] | None = None,
    **fixed: Any,
) -> list[RunSpec]:
    """Every (seed, policy, mode, scope, budget, protect), `full` with no budget; each spec once and
    checked, so a bad value fails before any run starts. `fixed`: any other CacheConfig field, one
    value each (buffer, window, ...)."""
    from kvagent.errors import ConfigError
    from kvagent.runtime.policies import make_policy

    args = policy_args or {}
    evicting = [b for b in budgets if b is not None]
    specs: list[RunSpec] = []
    for seed, policy, mode, scope in itertools.product(seeds, policies, modes, scopes):
        for budget, protect in itertools.product([None] if policy == "full" else evicting, protects):
            try:
                spec = RunSpec(policy=policy, mode=mode, scope=scope, protect=protect, budget=budget, seed=seed,
                               policy_args=dict(args.get(policy, {})), **fixed)  # fmt: skip
            except ConfigError as e:
                name, _, rest = str(e).partition(":")
                raise ConfigError(f"{_SWEEP_OPTION.get(name, name)}:{rest}") from None
            specs.append(spec)
    for policy in dict.fromkeys(policies):
        make_policy(policy, **args.get(policy, {}))  # the policy's options are valid
    return list(dict.fromkeys(specs))
