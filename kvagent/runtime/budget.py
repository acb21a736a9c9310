"""The one rule about a budget and what is protected: at every eviction round each layer's K must
exceed the entries that are never evicted (protect=prompt: the whole first prompt; protect=sink: the
first SINK_TOKENS), or the round could evict nothing. K only grows after the first round (a token
budget is fixed, a fraction grows with the episode), so the first round decides. Under the
recent-buffer framework the r-token recent buffer is kept outside K, so the rule is the same (the
prompt must fit K, not K + 2r); only the first round comes later (at K + 2r instead of K + r).

The session applies it at its first append; commands apply it earlier (before a sandbox opens or a
benchmark starts) with the prompt's length from the tokenizer, through the engine's prepared plan
(plan.py) of the config. When the first round comes and what K each layer has there are the
Schedule's (schedule.py), which the evictor asks too."""

from __future__ import annotations

import math
from typing import Any

from kvagent.errors import ConfigError
from kvagent.runtime.config import SINK_TOKENS, CacheConfig
from kvagent.runtime.schedule import Schedule


def check_budget(config: CacheConfig, policy: Any, max_context: int | None) -> None:
    """A token budget must fit the model's context and be a whole number of the policy's blocks."""
    if not config.evicts or not isinstance(config.budget, int):
        return
    b = config.budget
    if max_context and b > max_context:
        raise ConfigError(
            f"budget: {b} exceeds the model's context limit {max_context}; use a budget <= {max_context}"
        )
    block = policy.block
    if block > 1 and b % block:
        lo, hi = (b // block) * block, (b // block + 1) * block
        raise ConfigError(
            f"budget: {b} is not a multiple of {config.policy}'s block {block}; use {lo or hi} or {hi}"
        )


def first_round(
    config: CacheConfig, policy: Any, n_layers: int, prompt_length: int, layer: int
) -> int | None:
    """`Schedule.first_round` of these settings."""
    return Schedule(config, policy, n_layers).first_round(prompt_length, layer)


def prompt_fit_problem(
    config: CacheConfig, prompt_length: int, n_layers: int = 1, policy: Any = None, option: str = "--budget"
) -> str | None:
    """Why `config` could evict nothing at its first round with a first prompt of `prompt_length`
    tokens (None if it can). `option` is the flag the advice names (eval's is --budgets)."""
    if not config.evicts or config.protect == "none":
        return None
    return prompt_problem(Schedule.of(config, n_layers, policy), prompt_length, option)


def prompt_problem(schedule: Schedule, prompt_length: int, option: str = "--budget") -> str | None:
    """`prompt_fit_problem` of a prepared Schedule (a session's, a plan's)."""
    config, n_layers = schedule.config, schedule.n_layers
    if not config.evicts or config.protect == "none":
        return None
    for layer in range(n_layers):
        at = schedule.first_round(prompt_length, layer)
        if at is None:
            continue
        k = schedule.layer_budgets(at)[layer]
        protected = prompt_length if config.protect == "prompt" else min(SINK_TOKENS, at)
        if protected < k:
            continue
        kept = f"K={k}" if isinstance(config.budget, int) else f"K={config.budget} ({k} tokens at {at})"
        where = " (smallest layer)" if isinstance(config.budget, int) and k != config.budget else ""
        if config.protect == "sink":
            return (
                f"budget: {kept}{where} but protect=sink protects the first {SINK_TOKENS} tokens, so "
                f"nothing could be evicted; use a budget above {SINK_TOKENS} tokens"
            )
        need = roomy_budget(prompt_length)
        return (
            f"budget: {kept}{where} but protect=prompt protects all {prompt_length} prompt tokens, so "
            f"nothing could be evicted; use a budget above {prompt_length} (e.g. {option} {need}) or "
            "--protect sink"
        )
    return None


def check_run(
    engine: Any,
    config: CacheConfig,
    prompt_length: int | None = None,
    option: str = "--budget",
    *,
    context_limit: int | None = None,
    prompt_name: str = "the first prompt",
) -> str | None:
    """The one check a command makes before anything slow (a sandbox, a grid, a benchmark): raises
    the ConfigError of settings this model cannot run at all (the session's own checks: the policy's
    options, the budget against the model's context and the policy's block) and of a first prompt of
    `prompt_length` tokens that already reaches the agent's `context_limit` (`prompt_name`: what the
    error calls that prompt), and returns why that prompt leaves the Schedule's first round nothing to
    evict (None if it does not, or with no length). `option`: the flag the advice names (eval's is
    --budgets). It opens no session: it asks the engine's plan of `config` (plan.py), which the
    run's sessions then take."""
    plan = engine.plan(config)
    if prompt_length is None:
        return None
    if context_limit is not None and prompt_length >= context_limit:
        raise ConfigError(
            f"context-limit: {context_limit} tokens, but {prompt_name} is {prompt_length} tokens; use "
            f"--context-limit above {prompt_length}"
        )
    return prompt_problem(plan.schedule, prompt_length, option)


def check_prompt_fits(schedule: Schedule, prompt_length: int) -> None:
    """Raise the ConfigError of `prompt_problem`, if there is one."""
    problem = prompt_problem(schedule, prompt_length)
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
