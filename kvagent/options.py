"""Parsing of command-line values shared by every command: comma lists and budgets."""

from __future__ import annotations

from collections.abc import Sequence

from kvagent.errors import ConfigError


def split_list(text: str | Sequence[str], what: str) -> list[str]:
    """`a,b` (or repeated options, each possibly a comma list) -> ["a", "b"]."""
    items = text.split(",") if isinstance(text, str) else [x for t in text for x in t.split(",")]
    items = [x.strip() for x in items if x.strip()]
    if not items:
        raise ConfigError(f"{what}: got an empty list; pass comma-separated values")
    return items


def parse_budget(text: str | None, what: str = "budget") -> int | float | None:
    """`1024` tokens, `0.2` of the logical length, or `none`/`dense` for no eviction."""
    if text is None or text.strip().lower() in ("none", "dense", ""):
        return None
    item = text.strip()
    try:
        b: int | float = float(item) if any(c in item for c in ".eE") else int(item)
    except ValueError:
        raise ConfigError(
            f"{what}: {item!r} is not a number; pass tokens (1024) or a fraction (0.2)"
        ) from None
    return int(b) if isinstance(b, float) and b.is_integer() else b


def parse_budgets(text: str | Sequence[str], what: str = "budgets") -> list[int | float | None]:
    """A sweep's budgets, range-checked up front so a bad value fails before any run starts
    (a single budget is checked by CacheConfig)."""
    out = []
    for item in split_list(text, what):
        b = parse_budget(item, what)
        if b is not None and ((isinstance(b, int) and b < 1) or (isinstance(b, float) and not 0 < b < 1)):
            raise ConfigError(f"{what}: {item} must be >= 1 token or a fraction in (0,1)")
        out.append(b)
    return out
