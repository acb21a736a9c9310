"""A request's cache settings: the server's flags are the defaults, `kv_*` body fields override
them, and the result is checked as the CLI checks its options (CacheConfig's own checks, the
policy-needs-a-budget rule of `config.budget_problem`, unknown policy options), with the message's
field spelled as the request spells it (kv_budget, not budget).

The fields are the run's identity (`runspec.IDENTITY`: every CacheConfig field but how a session
runs), each `kv_<field>`, its JSON type that of its default (`runspec.DEFAULTS`); so a field added
to CacheConfig is a request field with no edit here."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from kvagent import runspec
from kvagent.errors import ConfigError
from kvagent.runtime import CacheConfig
from kvagent.runtime.config import budget_problem, budget_value
from kvagent.serve.errors import RequestError

_KINDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", dict: "an object"}


def kv_fields() -> dict[str, str]:
    """`kv_<field>` -> field, for every field of a run's identity (read as runspec has it now)."""
    return {f"kv_{name}": name for name in runspec.IDENTITY}


def request_spelling(message: str) -> str:
    """`budget: ...` -> `kv_budget: ...` (the field as the request names it): a message from
    CacheConfig or the runtime starts with the field it is about."""
    names = sorted(map(re.escape, runspec.IDENTITY), key=len, reverse=True)
    return re.sub(r"^(" + "|".join(names) + r")\b", lambda m: "kv_" + m.group(1), message, count=1)


def _say(name: str, value: Any = None) -> str:
    return f"kv_{name}" if value is None else f"kv_{name} {value}"


def _value(key: str, name: str, value: Any) -> Any:
    if name == "budget":  # tokens, a fraction, or a string the CLI would take ("1024", "0.2")
        if isinstance(value, str):
            try:
                return budget_value(value, key)
            except ConfigError as e:
                raise RequestError(str(e), param=key) from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RequestError(
                f"{key}: expected tokens (an int) or a fraction in (0,1), got {json.dumps(value)}", param=key
            )
        return value
    default = runspec.DEFAULTS[name]
    want = type(default)
    if default is None or want not in _KINDS:  # no type to hold it to: CacheConfig checks the value
        return value
    ok = isinstance(value, want) and (want is bool or not isinstance(value, bool))
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        ok, value = True, float(value)
    if not ok:
        raise RequestError(f"{key}: expected {_KINDS[want]}, got {json.dumps(value)}", param=key)
    return value


def request_config(defaults: CacheConfig, kv: dict[str, Any]) -> CacheConfig:
    """The CacheConfig of one request (`kv`: its kv_* fields that are set)."""
    if not kv:
        return defaults
    names = kv_fields()
    changes = {names[k]: _value(k, names[k], v) for k, v in kv.items()}
    policy = changes.get("policy", defaults.policy)
    if policy != defaults.policy:
        # the server's budget and options belong to its own policy
        changes.setdefault("policy_args", {})
        if policy == "full":
            changes.setdefault("budget", None)
    problem = budget_problem(policy, changes.get("budget", defaults.budget), _say)
    if problem:
        raise RequestError(request_spelling(problem), param="kv_budget")
    try:
        config = dataclasses.replace(defaults, **changes)
        if config.policy_args:
            from kvagent.runtime.config import build_policy

            build_policy(config)  # unknown options, bad values
    except ConfigError as e:
        raise RequestError(request_spelling(str(e))) from None
    except TypeError as e:  # a policy option of the wrong type that its constructor did not expect
        raise RequestError(f"kv_policy_args: {e}; check the option names and values") from None
    return config
