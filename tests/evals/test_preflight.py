"""Issue 16, point 5: the checks before an eval's first episode measure the prompt the sandbox really
shows, and the budget rule (runtime/budget.py) covers fraction budgets and protect=sink, in agreement
with what a real session does at its first eviction round."""

import pytest

from kvagent.agent import AgentConfig
from kvagent.agent.loop import run_episode
from kvagent.agent.solve import first_prompt_tokens
from kvagent.errors import ConfigError
from kvagent.evals.datasets import Instance
from kvagent.evals.preflight import check_grid
from kvagent.evals.runner import plan_runs
from kvagent.runtime import CacheConfig
from kvagent.runtime.budget import check_run, prompt_fit_problem
from kvagent.testing import ScriptedEngine, ScriptedSession

SUBMIT = "<function=finish>\n<parameter=command>submit</parameter>\n</function>"
LONG_WORKDIR = "/tmp/kvagent-sbx-123456-987654-q8z_3kxw/repo"


class Env:
    def __init__(self, workdir):
        self.workdir = workdir

    def run_tool(self, name, params, timeout=90):
        raise AssertionError("no tool runs in these episodes")

    def diff(self):
        return ""


@pytest.mark.parametrize("workdir", ["/testbed", LONG_WORKDIR])
def test_the_measured_prompt_is_the_one_the_episode_feeds(qwen3_tokenizer, workdir):
    config = AgentConfig(max_steps=3)
    issue = "add() subtracts instead of adding; see calc.py"
    session = ScriptedSession(qwen3_tokenizer, [SUBMIT])
    run_episode(session, Env(workdir), issue, config, tokenizer=qwen3_tokenizer)
    assert first_prompt_tokens(qwen3_tokenizer, issue, config, workdir) == session.appends[0]


def test_the_advice_names_the_local_prompt_not_the_testbed_one(qwen3_tokenizer):
    issue = "add() subtracts instead of adding"
    inst = Instance("i", "o/r", "HEAD", issue, "", [], [])
    engine = ScriptedEngine(qwen3_tokenizer, lambda c: [SUBMIT])
    runs = plan_runs(["i"], ["random"], ["persistent"], [256], [0])
    config = AgentConfig(max_steps=3)
    local = first_prompt_tokens(qwen3_tokenizer, issue, config, LONG_WORKDIR)
    assert local != first_prompt_tokens(qwen3_tokenizer, issue, config, "/testbed")
    with pytest.raises(
        ConfigError,
        match=rf"random__persistent__K256__recent-buffer on i .*protects all {local} prompt tokens",
    ):
        check_grid(engine, runs, {"i": inst}, config, LONG_WORKDIR)
    with pytest.raises(ConfigError, match="^context-limit: 100 tokens"):
        check_grid(engine, runs[:0] + plan_runs(["i"], ["full"], ["persistent"], [None], [0]), {"i": inst},
                   AgentConfig(context_limit=100), LONG_WORKDIR)  # fmt: skip


# (budget, protect, mode); prompt of 40 tokens, r = 16
CASES = [
    (0.5, "prompt", "persistent"),
    (0.5, "prompt", "reprefill"),
    (0.5, "sink", "persistent"),
    (0.5, "sink", "reprefill"),
    (0.1, "sink", "persistent"),
    (4, "sink", "persistent"),
    (8, "sink", "persistent"),
    (32, "prompt", "persistent"),
    (64, "prompt", "persistent"),
    (40, "prompt", "reprefill"),
]


@pytest.fixture(scope="module")
def tiny_engine():
    from kvagent.runtime import Engine

    return Engine.load("tiny-random-qwen3", device="cpu")


def session_fails(engine, config, prompt_length, monkeypatch):
    """Whether a real session hits the protected-entries error, with the up-front rule switched off."""
    monkeypatch.setattr("kvagent.runtime.session.check_prompt_fits", lambda *a, **k: None)  # imported by name
    s = engine.session(config)
    try:
        s.append(list(range(1000, 1000 + prompt_length)))
        s.append(list(range(2000, 2200)))
        for t in range(40):
            s.step(3000 + t)
    except ConfigError as e:
        assert "protected" in str(e)
        return True
    return False


@pytest.mark.parametrize(("budget", "protect", "mode"), CASES)
def test_the_rule_agrees_with_a_real_session(tiny_engine, monkeypatch, budget, protect, mode):
    config = CacheConfig(policy="random", budget=budget, buffer=16, protect=protect, mode=mode)
    problem = prompt_fit_problem(config, 40, tiny_engine.n_layers)
    assert (problem is not None) == session_fails(tiny_engine, config, 40, monkeypatch), problem
    if problem:
        assert problem.startswith("budget: ") and f"protect={protect}" in problem


def test_one_check_raises_what_the_model_cannot_run_and_returns_what_the_prompt_cannot(tiny_engine):
    with pytest.raises(ConfigError, match="multiple of nexus's block"):
        check_run(tiny_engine, CacheConfig(policy="nexus", budget=1001), 16)
    with pytest.raises(ConfigError, match="context limit"):
        check_run(tiny_engine, CacheConfig(policy="random", budget=10**9))
    config = CacheConfig(policy="random", budget=32, buffer=16)
    assert check_run(tiny_engine, config) is None and check_run(tiny_engine, config, 16) is None
    problem = check_run(tiny_engine, config, 40, option="--budgets")
    assert problem is not None and problem == prompt_fit_problem(
        config, 40, tiny_engine.n_layers, option="--budgets"
    )


def test_the_one_check_holds_the_context_limit_before_the_budget(tiny_engine):
    """solve and eval ask check_run for the context limit: a prompt that reaches it raises, before a
    budget it does not fit is returned; one token short of it, only that budget problem remains."""
    config = CacheConfig(policy="random", budget=32, buffer=16)
    named = "the first prompt of i"
    with pytest.raises(ConfigError, match=f"^context-limit: 40 tokens, but {named} is 40 tokens; use"):
        check_run(tiny_engine, config, 40, context_limit=40, prompt_name=named)
    assert check_run(tiny_engine, config, 40, context_limit=41) == check_run(tiny_engine, config, 40)
    assert check_run(tiny_engine, config, 16, context_limit=17) is None


def test_fraction_and_sink_budgets_are_checked():
    assert prompt_fit_problem(CacheConfig(policy="random", budget=0.5), 1656) is not None
    assert prompt_fit_problem(CacheConfig(policy="random", budget=4, protect="sink"), 1656) is not None
    assert prompt_fit_problem(CacheConfig(policy="random", budget=0.5, protect="sink"), 1656) is None
    assert prompt_fit_problem(CacheConfig(policy="random", budget=2048), 1656) is None
    advice = prompt_fit_problem(CacheConfig(policy="random", budget=1024), 1656, option="--budgets")
    assert int(advice.split("--budgets ")[1].split(")")[0]) > 1656
