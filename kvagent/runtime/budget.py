"""The one rule about a budget and the protected prompt: with protect=prompt every token of the first
prompt is kept, so each layer's K must exceed the prompt's length, or no round could evict anything.

The session applies it at its first append; commands apply it earlier (before a sandbox opens or a
benchmark starts) with the prompt's length from the tokenizer."""

from __future__ import annotations

import math
from typing import Any

from kvagent.errors import ConfigError
from kvagent.runtime.config import CacheConfig


def _smallest_budget(config: CacheConfig, n_layers: int, policy: Any = None) -> int:
    if policy is None:
        from kvagent.runtime.policies import make_policy

        policy = make_policy(config.policy, **config.policy_args)
    return min(int(k) for k in policy.layer_budgets(config.budget, n_layers))


def prompt_fit_problem(
    config: CacheConfig, prompt_length: int, n_layers: int = 1, policy: Any = None
) -> str | None:
    """Why `config` cannot hold a protected first prompt of `prompt_length` tokens (None if it can).
    Only int budgets are checked: a fractional K grows with the episode."""
    if not (config.evicts and config.protect == "prompt" and isinstance(config.budget, int)):
        return None
    smallest = _smallest_budget(config, n_layers, policy)
    if prompt_length < smallest:
        return None
    where = "" if smallest == config.budget else " (smallest layer)"
    return (
        f"budget: K={smallest}{where} but protect=prompt protects all {prompt_length} prompt tokens, so "
        f"nothing could be evicted; use a budget above {prompt_length} (e.g. --budget "
        f"{roomy_budget(prompt_length)}) or --protect sink"
    )


def check_prompt_fits(config: CacheConfig, prompt_length: int, n_layers: int = 1, policy: Any = None) -> None:
    """Raise the ConfigError of `prompt_fit_problem`, if there is one."""
    problem = prompt_fit_problem(config, prompt_length, n_layers, policy)
    if problem:
        raise ConfigError(problem)


def common_block() -> int:
    """The least budget granularity every registered policy accepts (the lcm of their blocks)."""
    from kvagent.runtime.policies import available, make_policy

    return math.lcm(*(make_policy(name).block for name in available()))


def roomy_budget(prompt_length: int) -> int:
    """A budget that fits a protected prompt of `prompt_length` tokens with a few blocks to spare,
    as a multiple of `common_block()` so that every policy takes it."""
    block = common_block()
    return (prompt_length // block + 4) * block
