"""A request's cache settings: the server's flags are the defaults, `kv_*` body fields override
them, and the result is checked as the CLI checks its options (CacheConfig's own checks, a policy
needs a budget and `full` takes none, unknown policy options), with the message's field spelled
as the request spells it (kv_budget, not budget)."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from kvagent.errors import ConfigError
from kvagent.options import parse_budget
from kvagent.runtime import CacheConfig
from kvagent.serve.errors import RequestError

FIELD_OF = {
    "kv_policy": "policy",
    "kv_budget": "budget",
    "kv_buffer": "buffer",
    "kv_mode": "mode",
    "kv_scope": "scope",
    "kv_protect": "protect",
    "kv_window": "window",
    "kv_seed": "seed",
    "kv_policy_args": "policy_args",
    "kv_head_budget": "head_budget",
}
_TYPES = {
    "policy": str, "mode": str, "scope": str, "protect": str, "head_budget": str,
    "buffer": int, "window": int, "seed": int, "policy_args": dict,
}  # fmt: skip
_LEADING = re.compile(r"^(policy_args|policy|budget|buffer|mode|scope|protect|window|seed|head_budget)\b")


def request_spelling(message: str) -> str:
    """`budget: ...` -> `kv_budget: ...` (the field as the request names it)."""
    return _LEADING.sub(lambda m: "kv_" + m.group(1), message, count=1)


def _value(key: str, value: Any) -> Any:
    name = FIELD_OF[key]
    if name == "budget":
        if isinstance(value, str):
            try:
                return parse_budget(value, key)
            except ConfigError as e:
                raise RequestError(str(e), param=key) from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RequestError(
                f"{key}: expected tokens (an int) or a fraction in (0,1), got {json.dumps(value)}"
            )
        return value
    want = _TYPES[name]
    if isinstance(value, bool) or not isinstance(value, want):
        kind = {str: "a string", int: "an integer", dict: "an object"}[want]
        raise RequestError(f"{key}: expected {kind}, got {json.dumps(value)}", param=key)
    return value


def request_config(defaults: CacheConfig, kv: dict[str, Any]) -> CacheConfig:
    """The CacheConfig of one request (`kv`: its kv_* fields that are set)."""
    if not kv:
        return defaults
    changes = {FIELD_OF[k]: _value(k, v) for k, v in kv.items()}
    policy = changes.get("policy", defaults.policy)
    if policy != defaults.policy:
        # the server's budget and options belong to its own policy
        changes.setdefault("policy_args", {})
        if policy == "full":
            changes.setdefault("budget", None)
    budget = changes.get("budget", defaults.budget)
    if policy != "full" and budget is None:
        raise RequestError(
            f"kv_budget: kv_policy {policy} evicts only under a budget; add kv_budget (e.g. 1024) or a "
            "fraction (0.2), or use kv_policy full",
            param="kv_budget",
        )
    if policy == "full" and budget is not None:
        raise RequestError(
            f"kv_budget: kv_policy full never evicts, so kv_budget {budget} would do nothing; pick an "
            "evicting kv_policy (e.g. snapkv) or drop kv_budget",
            param="kv_budget",
        )
    try:
        config = dataclasses.replace(defaults, **changes)
        if config.policy_args:
            from kvagent.runtime.policies import make_policy

            make_policy(config.policy, **config.policy_args)  # unknown options, bad values
    except ConfigError as e:
        raise RequestError(request_spelling(str(e))) from None
    except TypeError as e:  # a policy option of the wrong type that its constructor did not expect
        raise RequestError(f"kv_policy_args: {e}; check the option names and values") from None
    return config
