"""Checks of a whole eval grid before its first episode: every setting is built the way its runs will
build it, and the longest real first prompt is measured against every budget, so a bad setting fails
as one line naming it instead of being recorded, run after run, as a failed episode."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from kvagent.agent.config import AgentConfig
from kvagent.agent.solve import first_prompt_tokens
from kvagent.errors import ConfigError
from kvagent.evals.datasets import Instance
from kvagent.evals.runner import EvalRun


def check_sampling(agent_config: AgentConfig, runs: Sequence[EvalRun]) -> None:
    """The sampling settings of every seed (no engine needed: checked before one loads)."""
    for seed in sorted({r.spec.seed for r in runs}):
        replace(agent_config, seed=seed).sampling()


def check_grid(
    engine: Any,
    runs: Sequence[EvalRun],
    instances: Mapping[str, Instance],
    agent_config: AgentConfig,
    workdir: str,
) -> None:
    """Raise a one-line ConfigError naming the first setting of `runs` that cannot run: sampling
    settings (per seed), each cache configuration on this engine (block multiples, the model's context),
    and the protected prompt of the longest instance prompt against each budget and the context limit."""
    from kvagent.runtime.budget import check_run

    check_sampling(agent_config, runs)
    specs = list(dict.fromkeys(r.spec for r in runs))
    for spec in specs:
        try:
            check_run(engine, spec.cache_config())
        except ConfigError as e:
            raise ConfigError(f"{spec.label}: {e}") from None
    if not runs:
        return
    # Every check below gets harder with a longer prompt: the longest one decides.
    lengths = {
        iid: first_prompt_tokens(engine.tokenizer, instances[iid].problem_statement, agent_config, workdir)
        for iid in dict.fromkeys(r.instance_id for r in runs)
    }
    iid, longest = max(lengths.items(), key=lambda kv: kv[1])
    for spec in specs:
        # The context limit, the same for every spec, raises at the first, before any budget's fit.
        problem = check_run(
            engine,
            spec.cache_config(),
            longest,
            option="--budgets",
            context_limit=agent_config.context_limit,
            prompt_name=f"the first prompt of {iid}",
        )
        if problem:
            raise ConfigError(f"{spec.label} on {iid} (longest first prompt): {problem}")
