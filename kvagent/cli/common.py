"""What every command assembles the same way: the engine, a cache config and an agent config from the
shared options."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvagent.errors import ConfigError
from kvagent.options import parse_budget, parse_policy_args, split_list


def load_engine(model: str, device: str = "auto", dtype: str = "auto", max_batch: int = 1) -> Any:
    """The one place a command loads a model (`max_batch` > 1: concurrent sessions share forwards)."""
    import os

    import torch

    from kvagent.runtime import Engine
    from kvagent.runtime.engine import resolve_device

    resolve_device(device)  # a bad --device fails before the model is read
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        # A shared CPU: more threads than cores only adds contention.
        torch.set_num_threads(max(1, min(torch.get_num_threads(), os.cpu_count() or 1)))
    return Engine.load(model, device=device, dtype=dtype, max_batch=max_batch)


def cache_config(
    *, policy: str, budget: str | None, buffer: int, mode: str, scope: str, protect: str, window: int,
    seed: int, policy_arg: Sequence[str] | None, head_budget: str = "uniform",
) -> Any:  # fmt: skip
    """The CacheConfig of a one-run command (solve, chat) from its shared cache options."""
    from kvagent.runtime import CacheConfig

    return CacheConfig(
        policy=policy,
        budget=parse_budget(budget),
        buffer=buffer,
        mode=mode,
        scope=scope,
        protect=protect,
        window=window,
        seed=seed,
        policy_args=parse_policy_args(policy_arg, [policy]).get(policy, {}),
        head_budget=head_budget,
    )


def agent_config(**options: Any) -> Any:
    from kvagent.agent.config import AgentConfig

    return AgentConfig(**options)


def parse_seeds(text: str) -> list[int]:
    try:
        return [int(x) for x in split_list(text, "seeds")]
    except ValueError:
        raise ConfigError(f"seeds: {text!r} must be comma-separated integers") from None
