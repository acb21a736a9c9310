"""Parsing of command-line values shared by every command: comma lists, a sweep's budgets (each by
`runtime.config.budget_value`, the one budget check) and policy arguments."""

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
