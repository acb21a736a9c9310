"""The one rule about a budget and what is protected: at every eviction round each layer's K must
exceed the entries that are never evicted (protect=prompt: the whole first prompt; protect=sink: the
first SINK_TOKENS), or the round could evict nothing. K only grows after the first round (a token
budget is fixed, a fraction grows with the episode), so the first round decides. Under the
recent-buffer framework the r-token recent buffer is kept outside K, so the rule is the same (the
prompt must fit K, not K + 2r); only the first round comes later (at K + 2r instead of K + r).

The session applies it at its first append; commands apply it earlier (before a sandbox opens or a
benchmark starts) with the prompt's length from the tokenizer."""

from __future__ import annotations

import math
from typing import Any

from kvagent.errors import ConfigError
from kvagent.runtime.config import SINK_TOKENS, CacheConfig

_SEARCH_LIMIT = 1 << 26  # logical tokens; no first round below it = none that matters


def _policy(config: CacheConfig, policy: Any) -> Any:
    if policy is None:
        from kvagent.runtime.policies import make_policy
        from kvagent.runtime.policies.base import model_defaults

        filled = model_defaults(config.policy, {"window": config.window}, config.policy_args)
        policy = make_policy(config.policy, **filled, **config.policy_args)
    return policy


def layer_budgets(config: CacheConfig, policy: Any, n_layers: int, logical_length: int) -> list[int]:
    """Each layer's K at `logical_length` (a fractional budget is that fraction of it)."""
    b = config.budget
    k = b if isinstance(b, int) else max(1, int(b * logical_length))
    budgets = [int(x) for x in policy.layer_budgets(k, n_layers)]
    if len(budgets) != n_layers:
        raise RuntimeError(
            f"{config.policy}.layer_budgets returned {len(budgets)} budgets for {n_layers} layers"
        )
    return budgets


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
    """The logical length at which `layer` first evicts, where it can be known before the episode
    (None: no round, or one whose timing depends on the episode)."""
    b, r, recent = config.budget, config.buffer, config.recent
    if config.mode == "reprefill":
        # Every append rebuilds the cache and cuts it to K (+ the recent buffer) at once.
        k = layer_budgets(config, policy, n_layers, prompt_length)[layer]
        if prompt_length > k + recent:
            return prompt_length
        if not isinstance(b, int):
            return None
    shared = config.cadence == "shared"
    if isinstance(b, int):
        ks = layer_budgets(config, policy, n_layers, 0)
        # shared: the first layer's trigger, or later if this layer does not yet hold more than K + r
        return max(min(ks) + recent + r, ks[layer] + recent + 1) if shared else ks[layer] + recent + r

    # A fraction: the first length that reaches K(L) + r (+ r), by bisection (L - K(L) grows with L).
    def due(n: int) -> bool:
        ks = layer_budgets(config, policy, n_layers, n)
        if shared:
            return n > ks[layer] + recent and n >= min(ks) + recent + r
        return n >= ks[layer] + recent + r

    if not due(_SEARCH_LIMIT):
        return None
    lo, hi = 1, _SEARCH_LIMIT
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if due(mid) else (mid + 1, hi)
    # With scope=prefill, decoding never evicts: past the prompt, the round waits for the next append.
    return lo if config.scope == "prefill+decode" or lo <= prompt_length else None


def prompt_fit_problem(
    config: CacheConfig, prompt_length: int, n_layers: int = 1, policy: Any = None, option: str = "--budget"
) -> str | None:
    """Why `config` could evict nothing at its first round with a first prompt of `prompt_length`
    tokens (None if it can). `option` is the flag the advice names (eval's is --budgets)."""
    if not config.evicts or config.protect == "none":
        return None
    policy = _policy(config, policy)
    for layer in range(n_layers):
        at = first_round(config, policy, n_layers, prompt_length, layer)
        if at is None:
            continue
        k = layer_budgets(config, policy, n_layers, at)[layer]
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
