"""Pass@k: each of the k runs of an instance samples with its own seed, and its record says which."""

import contextlib

from kvagent.agent import AgentConfig
from kvagent.evals.datasets import Instance
from kvagent.evals.runner import EvalRunner, plan_runs
from kvagent.testing import ScriptedEngine

SUBMIT = "<function=finish>\n<parameter=command>submit</parameter>\n</function>"


class Env:
    workdir = "/testbed"

    def run_tool(self, name, params, timeout=90):
        from kvagent.sandbox import Result

        return Result(0, "<<<Finished>>>\n")

    def diff(self):
        return ""


class SeedEngine(ScriptedEngine):
    """Remembers the sampling of every reply, per session."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer, lambda config: [SUBMIT])
        self.made = []

    def session(self, config):
        s = super().session(config)
        self.made.append(s)
        return s


def test_each_run_of_pass_at_k_samples_with_its_own_recorded_seed(tokenizer, tmp_path):
    inst = Instance("x__y-1", "x/y", "0" * 40, "bug", test_patch="", FAIL_TO_PASS=[], PASS_TO_PASS=[])
    engine = SeedEngine(tokenizer)
    runner = EvalRunner(
        run_dir=tmp_path / "run",
        engine=engine,
        instances={inst.instance_id: inst},
        open_env=lambda _inst: contextlib.nullcontext(Env()),
        agent_config=AgentConfig(scaffold="r2egym", seed=123),  # the config's own seed is replaced per run
    )
    records = runner.run(plan_runs([inst.instance_id], ["full"], ["persistent"], [None], [0, 1, 2, 7]))
    sampled = sorted(call["sampling"].seed for s in engine.made for call in s.calls)
    assert sampled == [0, 1, 2, 7]  # one distinct seed per run, not the config's 123
    assert sorted(r["seed"] for r in records) == [0, 1, 2, 7]
    assert {r["scaffold"] for r in records} == {"r2egym"}
    assert all(r["exit_status"] == "submitted" for r in records)
