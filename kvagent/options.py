"""Parsing of command-line values shared by every command (their declarations: cli/settings.py):
comma lists, a sweep's budgets (each by `runtime.config.budget_value`, the one budget check) and
seeds, policy arguments, and a one-run command's cache options into its CacheConfig."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from kvagent.errors import ConfigError


def split_list(text: str | Sequence[str], what: str) -> list[str]:
    """`a,b` (or repeated options, each possibly a comma list) -> ["a", "b"]."""
    items = text.split(",") if isinstance(text, str) else [x for t in text for x in t.split(",")]
    items = [x.strip() for x in items if x.strip()]
    if not items:
        raise ConfigError(f"{what}: got an empty list; pass comma-separated values")
    return items


def parse_budgets(text: str | Sequence[str], what: str = "budgets") -> list[int | float | None]:
    """A sweep's budgets, each parsed and range-checked up front by `config.budget_value` (the one
    budget check), so a bad value fails before any run starts."""
    from kvagent.runtime.config import budget_value

    return [budget_value(item, what) for item in split_list(text, what)]


def parse_policy_args(items: Sequence[str] | None, policies: Sequence[str]) -> dict[str, dict[str, Any]]:
    """`--policy-arg [POLICY.]KEY=VALUE` (repeatable) -> {policy: {key: value}}. Values are JSON where
    they parse (numbers, true/false), else strings. KEY=VALUE names the one policy that takes options
    (every one but `full`); with several, write POLICY.KEY=VALUE."""
    tunable = list(dict.fromkeys(p for p in policies if p != "full"))
    out: dict[str, dict[str, Any]] = {}
    for item in items or []:
        head, sep, raw = item.partition("=")
        policy, dot, key = head.rpartition(".")
        like = f"{policy or (tunable[0] if tunable else 'nexus')}.{key or 'lam'}={raw or '0.5'}"
        if not sep or not key:
            problem = "is not [POLICY.]KEY=VALUE"
        elif not tunable:
            problem = f"has no policy to go to ({', '.join(policies)} takes no options)"
        elif dot and policy not in tunable:
            problem = f"names {policy!r}, which is not among the policies ({', '.join(tunable)})"
            like = f"{tunable[0]}.{key}={raw}"
        elif not dot and len(tunable) > 1:
            problem = f"names no policy and there are several ({', '.join(tunable)}); write POLICY.KEY=VALUE"
            like = f"{_taker(key, raw, tunable)}.{key}={raw}"
        else:
            try:
                value: Any = json.loads(raw)
            except json.JSONDecodeError:
                value = raw
            out.setdefault(policy or tunable[0], {})[key] = value
            continue
        raise ConfigError(f"policy-arg: {item!r} {problem}; e.g. --policy-arg {like}")
    return out


def _taker(key: str, raw: str, policies: Sequence[str]) -> str:
    """The first of `policies` that takes option `key` (for the example in an error), else the first."""
    from kvagent.runtime.policies import make_policy

    for policy in policies:
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        try:
            make_policy(policy, **{key: value})
            return policy
        except (ConfigError, TypeError, ValueError) as e:
            if "has no option" not in str(e):
                return policy  # it takes the key; only the value is off
    return policies[0]


def cache_config(
    *, policy: str, budget: str | None, policy_arg: Sequence[str] | None = None, **settings: Any
) -> Any:
    """The CacheConfig of a one-run command (solve, chat, serve) from its cache options as typed
    (`settings`: the other CacheConfig fields; `cli.settings.CacheOptions.config` passes them all); a
    policy without a budget (or a budget without a policy) and unknown policy options fail here,
    before the model loads."""
    from kvagent.runtime.config import CacheConfig, budget_problem, budget_value, build_policy

    k = budget_value(budget)
    args = parse_policy_args(policy_arg, [policy]).get(policy, {})
    config = CacheConfig(policy=policy, budget=k, policy_args=args, **settings)
    problem = budget_problem(policy, k, _option)
    if problem:
        raise ConfigError(problem)
    if args:
        build_policy(config)  # unknown options and bad values, before the model loads
    return config


def _option(name: str, value: Any = None) -> str:
    """A cache setting as the command line takes it: `--budget 1024`."""
    flag = "--" + name.replace("_", "-")
    return flag if value is None else f"{flag} {value}"


def parse_seeds(text: str) -> list[int]:
    """A sweep's seeds: `0,1,2`."""
    try:
        return [int(x) for x in split_list(text, "seeds")]
    except ValueError:
        raise ConfigError(f"seeds: {text!r} must be comma-separated integers") from None
