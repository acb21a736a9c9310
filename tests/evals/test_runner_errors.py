"""Issue 16: infrastructure errors are recorded as such, never counted as a policy's failure, shown in
the report and redone by the next run; a torn runs.jsonl loses nothing; parallel episodes killed
half way and rerun lose and duplicate nothing. Scripted engine, local sandboxes, no grading."""

import json
import subprocess

import pytest

from kvagent.agent import AgentConfig
from kvagent.cli.environments import local_env
from kvagent.evals.datasets import Instance
from kvagent.evals.report import write_report
from kvagent.evals.runner import RUNS_FILE, EvalRunner, load_records, plan_runs
from kvagent.evals.stats import summarize
from kvagent.sandbox.errors import SandboxError
from kvagent.testing import CALC_PY, ScriptedEngine, git_repo
from tests.helpers import SUBMIT


@pytest.fixture()
def checkouts(tmp_path):
    repos = tmp_path / "repos"
    instances = {}
    for n in range(3):
        iid = f"fixture__calc-{n}"
        git_repo(repos / iid, {"calc.py": CALC_PY})
        instances[iid] = Instance(
            iid, "fixture/calc", "HEAD", "add() subtracts", "diff --git a/t b/t\n", ["t"], []
        )
    return instances, repos


def runner(run_dir, engine, instances, open_env, grade=None, concurrency=1):
    return EvalRunner(
        run_dir=run_dir, engine=engine, instances=instances, open_env=open_env, grade=grade,
        agent_config=AgentConfig(max_steps=2), model_name="scripted", concurrency=concurrency,
    )  # fmt: skip


def grade_by_policy(instance, patch, log_dir):
    return {"status": "resolved", "resolved": True}


def test_infrastructure_errors_are_recorded_not_counted_and_redone(tmp_path, checkouts, qwen3_tokenizer):
    instances, repos = checkouts
    specs = plan_runs(list(instances), ["random"], ["persistent"], [4096], [0])
    working = local_env(repos, "none")

    def flaky(instance):  # the sandbox of one instance cannot start (e.g. a missing image)
        if instance.instance_id == "fixture__calc-1":
            raise SandboxError("image kvagent/sweb.eval.fixture__calc-1 not found")
        return working(instance)

    engine = ScriptedEngine(qwen3_tokenizer, lambda c: [SUBMIT])
    run_dir = tmp_path / "run"
    records = runner(run_dir, engine, instances, flaky, grade=grade_by_policy).run(specs)
    failed = [r for r in records if r["infra_error"]]
    assert [r["instance_id"] for r in failed] == ["fixture__calc-1"] and "not found" in failed[0]["error"]
    assert set(load_records(run_dir)) == {s.run_id for s in specs} - {failed[0]["run_id"]}

    summary = write_report(run_dir)
    (row,) = summary["configs"]
    assert row["n_errors"] == 1 and row["n_instances"] == 2
    assert row["pass_at_1"] == 1.0  # the error is not a failure of the policy
    report = (run_dir / "report.md").read_text()
    assert "1 runs hit infrastructure errors" in report and "| errors |" in report

    # the next invocation redoes the errored run only, and the report then counts it
    engine2 = ScriptedEngine(qwen3_tokenizer, lambda c: [SUBMIT])
    records = runner(run_dir, engine2, instances, working, grade=grade_by_policy).run(specs)
    assert engine2.sessions == 1 and not any(r["infra_error"] for r in records)
    summary = write_report(run_dir)
    assert summary["configs"][0]["n_errors"] == 0 and summary["configs"][0]["n_instances"] == 3
    assert summary["n_errors"] == 0 and "infrastructure errors" not in (run_dir / "report.md").read_text()


def test_a_crashing_grader_is_an_infrastructure_error(tmp_path, checkouts, qwen3_tokenizer):
    instances, repos = checkouts
    specs = plan_runs(list(instances)[:1], ["random"], ["persistent"], [4096], [0])

    def broken(instance, patch, log_dir):
        raise OSError("docker daemon went away")

    engine = ScriptedEngine(qwen3_tokenizer, lambda c: [SUBMIT])
    (rec,) = runner(tmp_path / "run", engine, instances, local_env(repos, "none"), grade=broken).run(specs)
    assert rec["infra_error"] and "docker daemon went away" in rec["error"] and not rec["resolved"]


def test_old_error_records_are_redone_and_not_counted(tmp_path):
    """Records written before `infra_error` existed: `exit_status: error` counts as one."""
    runs = [
        {"instance_id": "a", "policy": "p", "mode": "persistent", "budget": 1, "seed": 0, "resolved": False,
         "exit_status": "error", "error": "ConfigError: temperature"},
        {"instance_id": "b", "policy": "p", "mode": "persistent", "budget": 1, "seed": 0, "resolved": True,
         "exit_status": "submitted"},
    ]  # fmt: skip
    (row,) = summarize(runs, n_boot=10)["configs"]
    assert row["pass_at_1"] == 1.0 and row["n_errors"] == 1


def test_a_torn_runs_file_resumes_without_losing_a_record(tmp_path, checkouts, qwen3_tokenizer):
    instances, repos = checkouts
    specs = plan_runs(list(instances), ["random"], ["persistent"], [4096], [0])
    run_dir = tmp_path / "run"
    env = local_env(repos, "none")
    runner(run_dir, ScriptedEngine(qwen3_tokenizer, lambda c: [SUBMIT]), instances, env).run(specs[:2])
    with (run_dir / RUNS_FILE).open("a") as f:  # the disk filled up in the middle of the third record
        f.write('{"run_id": "fixture__calc-2__random__persistent__K4096__s0", "conf')

    engine = ScriptedEngine(qwen3_tokenizer, lambda c: [SUBMIT])
    runner(run_dir, engine, instances, env).run(specs)
    assert engine.sessions == 1
    lines = [json.loads(x) for x in (run_dir / RUNS_FILE).read_text().splitlines()]
    assert sorted(r["run_id"] for r in lines) == sorted(s.run_id for s in specs)
    assert write_report(run_dir)["n_runs"] == 3


class KilledEngine(ScriptedEngine):
    """Dies (as on Ctrl-C / a kill) when episode `die_at` starts; episodes take a moment, so several
    run at once."""

    def __init__(self, tokenizer, die_at=None):
        super().__init__(tokenizer, lambda c: [SUBMIT])
        self.die_at = die_at

    def session(self, config):
        import time

        time.sleep(0.05)
        if self.die_at is not None and self.sessions + 1 == self.die_at:
            self.sessions += 1
            raise KeyboardInterrupt
        return super().session(config)


def test_concurrent_episodes_killed_and_rerun_lose_and_duplicate_nothing(
    tmp_path, checkouts, qwen3_tokenizer
):
    instances, repos = checkouts
    specs = plan_runs(list(instances), ["random", "streaming"], ["persistent"], [4096], [0, 1])
    assert len(specs) == 12
    run_dir = tmp_path / "run"
    env = local_env(repos, "none")
    with pytest.raises(KeyboardInterrupt):
        runner(run_dir, KilledEngine(qwen3_tokenizer, die_at=7), instances, env, concurrency=4).run(specs)
    first = load_records(run_dir)
    assert 0 < len(first) < 12

    engine = KilledEngine(qwen3_tokenizer)
    records = runner(run_dir, engine, instances, env, concurrency=4).run(specs)
    assert engine.sessions == 12 - len(first)  # only what was not recorded is redone
    ids = [json.loads(x)["run_id"] for x in (run_dir / RUNS_FILE).read_text().splitlines()]
    assert sorted(ids) == sorted(s.run_id for s in specs)  # every run exactly once
    assert len(records) == 12 and all(r["exit_status"] == "submitted" for r in records)


def test_a_run_directory_of_only_errors_still_reports(tmp_path, checkouts, qwen3_tokenizer):
    instances, _ = checkouts
    specs = plan_runs(list(instances)[:1], ["random"], ["persistent"], [4096], [0])

    def no_sandbox(instance):
        raise SandboxError("docker is not running")

    engine = ScriptedEngine(qwen3_tokenizer, lambda c: [SUBMIT])
    runner(tmp_path / "run", engine, instances, no_sandbox).run(specs)
    summary = write_report(tmp_path / "run")
    assert summary["n_errors"] == 1 and summary["n_runs"] == 0
    assert "docker is not running" in json.dumps(summary["configs"][0]["errors"])


@pytest.mark.slow
def test_eval_concurrency_4_with_the_tiny_model_killed_and_rerun(tmp_path, checkouts):
    """The real path: `kvagent eval --concurrency 4` over one batched tiny engine, SIGKILLed once a
    run is recorded, then rerun: every run recorded exactly once."""
    import os
    import signal
    import sys
    import time

    instances, repos = checkouts
    dataset = tmp_path / "mini.jsonl"
    dataset.write_text("".join(json.dumps(i.to_record()) + "\n" for i in list(instances.values())[:2]))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "kvagent", "eval", "--dataset", str(dataset), "--env", "local",
           "--repos", str(repos), "--isolation", "none", "--model", "tiny-random-qwen3",
           "--policies", "random,streaming", "--modes", "persistent", "--budgets", "4096", "--seeds", "0,1",
           "--max-steps", "2", "--max-new-tokens", "8", "--no-grade", "--concurrency", "4", "--out", str(out)]  # fmt: skip
    runs = out / RUNS_FILE
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not (runs.exists() and runs.read_text().count("\n") >= 1) and proc.poll() is None:
            assert time.monotonic() < deadline, "no run finished in time"
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    killed_with = len(load_records(out))
    assert killed_with >= 1, proc.stderr.read().decode()[-2000:]

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"{killed_with} already finished" in again.stderr
    ids = [json.loads(x)["run_id"] for x in runs.read_text().splitlines()]
    assert len(ids) == 8 == len(set(ids))
