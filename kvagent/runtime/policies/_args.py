"""Validation of policy_args: one-line ConfigErrors that name the field and the fix."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from kvagent.errors import ConfigError


def reject_unknown(policy: str, unknown: dict[str, Any], allowed: Iterable[str]) -> None:
    if unknown:
        raise ConfigError(
            f"policy_args: {policy} has no option(s) {', '.join(sorted(unknown))}; "
            f"valid: {', '.join(allowed) or 'none'}"
        )


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
