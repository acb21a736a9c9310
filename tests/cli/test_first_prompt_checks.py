"""Issue 25: solve, chat and eval count an episode's first prompt one way (`first_prompt_tokens`, the
agent's own rendering, step notice included), so their budget checks before a sandbox opens agree,
also on an instance whose prompt is one token from the budget."""

import pytest

from kvagent.agent import AgentConfig
from kvagent.agent.solve import first_prompt_tokens
from kvagent.cli.solve import check_before_sandbox
from kvagent.errors import ConfigError, KvagentError
from kvagent.evals.datasets import Instance
from kvagent.evals.preflight import check_grid
from kvagent.evals.runner import plan_runs
from kvagent.runtime import CacheConfig
from kvagent.testing import ScriptedEngine
from tests.helpers import SUBMIT

ISSUE = "add() subtracts instead of adding; see calc.py"


def passes(check) -> bool:
    try:
        check()
    except KvagentError as e:
        assert isinstance(e, ConfigError) or str(e).startswith("context-limit:"), e
        return False
    return True


@pytest.mark.parametrize("workdir", ["/testbed", "/tmp/kvagent-sbx-123456-987654-q8z_3kxw/repo"])
@pytest.mark.parametrize("agent", [AgentConfig(), AgentConfig(prompt_style="issue_first", soft_step_limit=0)])
def test_solve_and_eval_agree_on_a_budget_one_token_from_the_prompt(qwen3_tokenizer, workdir, agent):
    engine = ScriptedEngine(qwen3_tokenizer, lambda config: [SUBMIT])
    engine.n_layers = 2
    instance = Instance("i", "o/r", "HEAD", ISSUE, "", [], [])
    n = first_prompt_tokens(qwen3_tokenizer, ISSUE, agent, workdir)
    # protect=prompt keeps all n prompt tokens, so a budget of n evicts nothing and n + 1 can.
    for budget, fits in ((n, False), (n + 1, True)):
        config = CacheConfig(policy="random", budget=budget, buffer=16)
        runs = plan_runs(["i"], ["random"], ["persistent"], [budget], [0], buffer=16)
        solve_ok = passes(lambda: check_before_sandbox(engine, config, agent, ISSUE, workdir))  # noqa: B023
        eval_ok = passes(lambda: check_grid(engine, runs, {"i": instance}, agent, workdir))  # noqa: B023
        assert solve_ok == eval_ok == fits, (budget, n)
    # ... and the context limit, at the same boundary.
    for limit, fits in ((n, False), (n + 1, True)):
        limited = AgentConfig(**{**agent.__dict__, "context_limit": limit})
        full = plan_runs(["i"], ["full"], ["persistent"], [None], [0])
        solve_ok = passes(lambda: check_before_sandbox(engine, CacheConfig(), limited, ISSUE, workdir))  # noqa: B023
        eval_ok = passes(lambda: check_grid(engine, full, {"i": instance}, limited, workdir))  # noqa: B023
        assert solve_ok == eval_ok == fits, (limit, n)


def test_the_count_is_the_prompt_the_episode_feeds(qwen3_tokenizer):
    """What solve checks is what its episode appends first (system, instance prompt, step notice)."""
    from kvagent.agent.solve import solve_episode

    class Env:
        workdir = "/testbed"

        def diff(self):
            return ""

    engine = ScriptedEngine(qwen3_tokenizer, lambda config: [SUBMIT])
    sessions = []
    make = engine.session
    engine.session = lambda config: sessions.append(make(config)) or sessions[-1]
    agent = AgentConfig(max_steps=2)
    solve_episode(engine, Env(), ISSUE, config=agent)
    assert sessions[0].appends[0] == first_prompt_tokens(qwen3_tokenizer, ISSUE, agent, "/testbed")
