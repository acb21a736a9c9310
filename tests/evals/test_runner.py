"""End-to-end eval with a scripted model over a fixture SWE-bench instance: two policies x two
modes x two seeds, killed half way and resumed; graded for real in local sandboxes."""

import json
import subprocess

import pytest

from kvagent.agent import AgentConfig
from kvagent.cli.environments import local_env, local_grader
from kvagent.evals.datasets import Instance
from kvagent.evals.report import write_report
from kvagent.evals.runner import RUNS_FILE, EvalRunner, load_records, plan_runs
from kvagent.testing import ScriptedEngine, calc_record
from tests.helpers import SUBMIT

FIX = (
    "I will fix the operator.\n<function=execute_bash>\n<parameter=cmd>sed -i '2s/a - b/a + b/' calc.py"
    "</parameter>\n</function>"
)


class DyingEngine(ScriptedEngine):
    """`random` fixes the bug; `streaming` submits without fixing. Optionally dies on session N."""

    def __init__(self, tokenizer, die_at=None):
        super().__init__(tokenizer, lambda config: [FIX, SUBMIT] if config.policy == "random" else [SUBMIT])
        self.die_at = die_at

    def session(self, config):
        if self.die_at is not None and self.sessions + 1 == self.die_at:
            self.sessions += 1
            raise KeyboardInterrupt  # the process is killed in the middle of the batch
        return super().session(config)


@pytest.fixture()
def fixture_instance(tmp_path):
    repos = tmp_path / "repos"
    return Instance.from_record(calc_record(repos, "fixture__calc-1")), repos


def make_runner(run_dir, engine, inst, repos):
    return EvalRunner(
        run_dir=run_dir,
        engine=engine,
        instances={inst.instance_id: inst},
        open_env=local_env(repos),
        grade=local_grader(repos),
        agent_config=AgentConfig(max_steps=4),
        model_name="scripted",
    )


def test_eval_killed_half_way_resumes_without_loss_or_duplicates(tmp_path, fixture_instance, qwen3_tokenizer):
    inst, repos = fixture_instance
    specs = plan_runs([inst.instance_id], ["random", "streaming"], ["persistent", "reprefill"], [64], [0, 1])
    assert len(specs) == 8
    run_dir = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        make_runner(run_dir, DyingEngine(qwen3_tokenizer, die_at=4), inst, repos).run(specs)
    assert len(load_records(run_dir)) == 3  # three finished before the kill; the fourth is lost work

    engine = DyingEngine(qwen3_tokenizer)
    records = make_runner(run_dir, engine, inst, repos).run(specs)
    assert engine.sessions == 5  # only the unfinished runs were redone
    lines = [json.loads(x) for x in (run_dir / RUNS_FILE).read_text().splitlines()]
    ids = [r["run_id"] for r in lines]
    assert sorted(ids) == sorted(s.run_id for s in specs) and len(ids) == len(set(ids))
    by_policy = {p: [r["resolved"] for r in records if r["policy"] == p] for p in ("random", "streaming")}
    assert by_policy == {"random": [True] * 4, "streaming": [False] * 4}  # real grading of real patches
    assert all(r["grade_status"] in ("resolved", "unresolved") for r in records)

    # a third invocation has nothing left to do
    again = DyingEngine(qwen3_tokenizer)
    make_runner(run_dir, again, inst, repos).run(specs)
    assert again.sessions == 0

    preds = (
        (run_dir / "predictions" / "random__persistent__K64__recent-buffer__s0.jsonl")
        .read_text()
        .splitlines()
    )
    pred = json.loads(preds[0])
    assert pred["instance_id"] == inst.instance_id and "a + b" in pred["model_patch"]
    assert (run_dir / lines[0]["trajectory"]).exists()

    summary = write_report(run_dir)
    for row in summary["configs"]:
        direct = [r["resolved"] for r in lines if r["policy"] == row["policy"] and r["mode"] == row["mode"]]
        assert row["resolved"] == pytest.approx(sum(direct) / len({r["seed"] for r in lines}))
    assert (run_dir / "report.md").exists() and (run_dir / "report.png").exists()


def test_full_policy_runs_once_and_is_recorded_for_each_mode(tmp_path, fixture_instance, qwen3_tokenizer):
    inst, repos = fixture_instance
    specs = plan_runs([inst.instance_id], ["full"], ["persistent", "reprefill"], [64], [0])
    engine = DyingEngine(qwen3_tokenizer)
    records = make_runner(tmp_path / "run", engine, inst, repos).run(specs)
    assert engine.sessions == 1
    assert {r["mode"] for r in records} == {"persistent", "reprefill"}
    assert records[1]["derived_from"] == records[0]["run_id"]


def test_each_episode_reports_its_agent_events(tmp_path, fixture_instance, qwen3_tokenizer):
    """`on_event` sees every episode's replies, observations and end (what eval's live stream shows)."""
    from dataclasses import replace

    inst, repos = fixture_instance
    events = []
    runner = replace(
        make_runner(tmp_path / "run", DyingEngine(qwen3_tokenizer), inst, repos), on_event=events.append
    )
    runner.run(plan_runs([inst.instance_id], ["random"], ["persistent"], [64], [0]))
    kinds = [e.kind for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("reply") == 2
    assert "observation" in kinds


@pytest.mark.slow
def test_kvagent_eval_cli_with_tiny_model_and_local_sandboxes(tmp_path, fixture_instance):
    """The real model path through the CLI: plan, run, grade, resume (nothing redone), report."""
    import sys

    inst, repos = fixture_instance
    dataset = tmp_path / "fixture.jsonl"
    dataset.write_text(json.dumps(inst.to_record()) + "\n")
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "kvagent",
        "eval",
        "--dataset",
        str(dataset),
        "--env",
        "local",
        "--repos",
        str(repos),
        "--model",
        "tiny-random-qwen3",
        "--policies",
        "full,random",
        "--modes",
        "persistent,reprefill",
        "--budgets",
        "2048",
        "--max-steps",
        "1",
        "--max-new-tokens",
        "8",
        "--out",
        str(out),
    ]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    records = [json.loads(x) for x in (out / RUNS_FILE).read_text().splitlines()]
    assert len(records) == 4 and {r["exit_status"] for r in records} <= {"step_limit", "submitted"}
    assert all(r["resolved"] is False for r in records)  # a random model fixes nothing
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0 and "4 already finished" in second.stderr
    assert len((out / RUNS_FILE).read_text().splitlines()) == 4
    assert "random" in (out / "report.md").read_text()
    bad = subprocess.run(
        [*cmd[:-2], "--out", str(tmp_path / "x"), "--budgets", "-5"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "budget" in bad.stderr


def test_concurrent_episodes_record_every_run_once(tmp_path, fixture_instance, qwen3_tokenizer):
    inst, repos = fixture_instance
    specs = plan_runs([inst.instance_id], ["random", "streaming"], ["persistent", "reprefill"], [64], [0])
    runner = make_runner(tmp_path / "run", DyingEngine(qwen3_tokenizer), inst, repos)
    runner.concurrency = 2
    records = runner.run(specs)
    assert sorted(r["run_id"] for r in records) == sorted(s.run_id for s in specs)
    lines = (tmp_path / "run" / RUNS_FILE).read_text().splitlines()
    assert len(lines) == 4
    assert [r["resolved"] for r in records if r["policy"] == "random"] == [True, True]
