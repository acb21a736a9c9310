"""Policy knobs: dataclass fields whose metadata names their check, and the one path that refuses
unknown knobs and validates the rest. Every error is a one-line ConfigError naming the field and
the fix."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

from kvagent.errors import ConfigError

Check = Callable[[str, Any], Any]  # (field name, value) -> the value to store; raises ConfigError


def knob(default: Any, check: Check | None = None, **field_kw: Any) -> Any:
    """A policy knob with its default; `check(name, value)` validates and normalises it when the
    policy is made (BasePolicy.__post_init__ runs every field's check)."""
    return dataclasses.field(default=default, metadata={"check": check} if check else {}, **field_kw)


def int_knob(default: int, minimum: int = 0) -> Any:
    return knob(default, functools.partial(int_arg, minimum=minimum))


def float_knob(default: float, lo: float = 0.0, hi: float = math.inf, hint: str = "") -> Any:
    return knob(default, functools.partial(float_arg, lo=lo, hi=hi, hint=hint))


def bool_knob(default: bool) -> Any:
    return knob(default, bool_arg)


def recency_knob(check: Check, **check_kw: Any) -> Any:
    """A policy's own recency keep (SnapKV's keep_window, H2O's recent, ...): None by default, which
    lets the eviction framework decide (`base.own_recency`); a given value is checked by `check`."""
    return knob(None, optional(functools.partial(check, **check_kw) if check_kw else check))


def knob_names(cls: type) -> list[str]:
    """The knobs a policy class takes: its init fields, in declaration order."""
    return [f.name for f in dataclasses.fields(cls) if f.init]


def reject_unknown(policy: str, args: dict[str, Any], cls: type) -> None:
    valid = knob_names(cls)
    unknown = sorted(set(args) - set(valid))
    if unknown:
        raise ConfigError(
            f"policy_args: {policy} has no option(s) {', '.join(unknown)}; valid: {', '.join(valid) or 'none'}"
        )


def validate(policy: Any) -> None:
    """Run each field's check on the value the policy was made with, storing what it returns."""
    for f in dataclasses.fields(policy):
        check = f.metadata.get("check")
        if check is not None:
            setattr(policy, f.name, check(f.name, getattr(policy, f.name)))


def int_arg(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"policy_args.{name}: must be an int >= {minimum}, got {value!r}")
    return value


def float_arg(name: str, value: Any, lo: float = 0.0, hi: float = math.inf, hint: str = "") -> float:
    """A finite number in [lo, hi]."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (lo <= value <= hi and math.isfinite(value))
    ):
        rng = f">= {lo:g}" if hi == math.inf else f"in [{lo:g}, {hi:g}]"
        raise ConfigError(f"policy_args.{name}: must be a finite number {rng}{hint}, got {value!r}")
    return float(value)


def bool_arg(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"policy_args.{name}: must be true or false, got {value!r}")
    return value


def odd_kernel(name: str, value: Any) -> int:
    """A max-pooling width: odd, so 'same' padding keeps the entries aligned."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value % 2 == 0:
        raise ConfigError(f"policy_args.{name}: must be an odd int >= 1 (same padding), got {value!r}")
    return value


def optional(check: Check) -> Check:
    """`check`, but None passes through (a knob whose absence means something)."""

    def run(name: str, value: Any) -> Any:
        return None if value is None else check(name, value)

    return run
