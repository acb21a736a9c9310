"""`kvagent eval` on Ray: a local two-CPU cluster started by the test, two actors with the tiny model over
local sandboxes; every run recorded once, a killed actor's run redone on the other, a rerun repeats
nothing; and without --ray nothing imports Ray."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvagent.agent.config import AgentConfig
from kvagent.cli.settings import EngineOptions
from kvagent.errors import ConfigError, KvagentError
from kvagent.evals.datasets import Instance
from kvagent.evals.distributed import RayExecutor, read_tree, sweep_stale_run_dirs, write_run_files
from kvagent.evals.runner import RUNS_FILE, EvalRunner, load_records, plan_runs
from kvagent.testing import calc_record


@pytest.fixture()
def fixture_set(tmp_path):
    repos = tmp_path / "repos"
    ids = ("fixture__calc-1", "fixture__calc-2")
    return [Instance.from_record(calc_record(repos, iid, PASS_TO_PASS=[])) for iid in ids], repos


# ------------------------------------------------------------------------------------------ no Ray


def test_a_runs_files_travel_into_the_run_directory_and_never_out_of_it(tmp_path):
    scratch = tmp_path / "scratch"
    (scratch / "grading" / "a__x__s0").mkdir(parents=True)
    (scratch / "trajectories").mkdir()
    (scratch / "trajectories" / "a__x__s0.traj.json").write_text("{}")
    (scratch / "grading" / "a__x__s0" / "test_output.txt").write_text("ok")
    files = read_tree(scratch)
    assert sorted(files) == ["grading/a__x__s0/test_output.txt", "trajectories/a__x__s0.traj.json"]
    write_run_files(tmp_path / "run", {**files, RUNS_FILE: b"{}\n", "predictions/x__s0.jsonl": b"{}\n"})
    assert (tmp_path / "run" / "grading" / "a__x__s0" / "test_output.txt").read_text() == "ok"
    assert sorted(p.name for p in (tmp_path / "run").rglob("*") if p.is_file()) == [
        "a__x__s0.traj.json",
        "test_output.txt",
    ]  # runs.jsonl and predictions are the driver's alone
    assert not list((tmp_path / "run").rglob("*.tmp"))
    with pytest.raises(KvagentError, match="outside the run directory"):
        write_run_files(tmp_path / "run", {"../escape.txt": b"x"})
    assert not (tmp_path / "escape.txt").exists()


def test_live_table_shows_progress_per_engine():
    from rich.console import Console

    from kvagent.cli.eval.ray import EngineTable

    runs = plan_runs(["a", "b"], ["random"], ["persistent"], [2048], [0])
    table = EngineTable(runs, {}, engines=2)
    table.on_event("ready", 0, None, {"node": "10.0.0.7", "gpus": ["3"], "pid": 1})
    table.on_event("ready", 1, None, {"node": "10.0.0.8", "gpus": [], "pid": 2})
    for run in runs:
        table.on_event("start", 0, run, None)
    table.on_event("requeued", 0, runs[1], None)
    table.on_event("lost", 0, None, None)
    table.on_event("start", 1, runs[1], None)
    table.on_event("finished", 1, runs[1], {"resolved": True})
    table.on_record("done", runs[1], {"resolved": True})
    console = Console(record=True, width=100)
    console.print(table.render())
    text = console.export_text()
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[1:-1]]
            for line in text.splitlines() if line.count("│") == 8}  # fmt: skip
    assert rows["0"] == ["0", "10.0.0.7", "3", "restarting", "1", "0", "1"]
    assert rows["1"] == ["1", "10.0.0.8", "cpu", "running", "0", "1", "0"]
    assert "1/2" in text and "1 runs left" in text


def test_ray_option_without_ray_installed_says_how_to_install_it(monkeypatch):
    from kvagent.cli.eval.ray import init_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if it were not installed
    with pytest.raises(ConfigError, match=r"pip install 'kvagent\[ray\]'"):
        init_ray("auto")


def test_without_ray_option_nothing_imports_ray(tmp_path, fixture_set):
    """A local eval (scripted model, local sandboxes) and the CLI's eval command in a fresh interpreter:
    Ray stays out of sys.modules."""
    instances, repos = fixture_set
    dataset = tmp_path / "set.jsonl"
    dataset.write_text("".join(json.dumps(i.to_record()) + "\n" for i in instances))
    script = f"""
import sys
from pathlib import Path
from typer.testing import CliRunner
from kvagent.cli.app import app
from kvagent.cli.environments import local_env
from kvagent.evals import distributed  # importing the Ray executor's module must not import Ray
from kvagent.evals.datasets import load_instances
from kvagent.evals.runner import EvalRunner, plan_runs
from kvagent.runtime.models import load_qwen3_tokenizer
from kvagent.testing import ScriptedEngine

insts = load_instances({str(dataset)!r})
submit = "<function=finish>\\n<parameter=command>submit</parameter>\\n</function>"
engine = ScriptedEngine(load_qwen3_tokenizer(), lambda config: [submit])
runner = EvalRunner(run_dir=Path({str(tmp_path / "run")!r}), engine=engine,
                    instances={{i.instance_id: i for i in insts}}, open_env=local_env(Path({str(repos)!r})))
records = runner.run(plan_runs([i.instance_id for i in insts], ["random"], ["persistent"], [64], [0]))
assert len(records) == 2, records
assert CliRunner().invoke(app, ["eval", "--help"]).exit_code == 0
bad = CliRunner().invoke(app, ["eval", "--dataset", {str(dataset)!r}, "--engines", "2"])
assert bad.exit_code == 2, bad.output
print("RAY_IMPORTED" if "ray" in sys.modules else "NO_RAY")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "NO_RAY"


# ------------------------------------------------------------------------------------------ on Ray


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    from ray import cloudpickle

    # Actors unpickle this module's doubles by value: the test module is not importable on workers.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # ray.init puts its own SIGTERM / SIGINT handlers in this process: put the test process's back
    # after, so later tests see the handlers they expect.
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield ray
    ray.shutdown()
    for s, h in handlers.items():
        signal.signal(s, h)


class KillingEngine:
    """The tiny engine, except that the first session opened anywhere in the cluster SIGKILLs its
    own actor process, in the middle of that episode (its sandbox is already open)."""

    def __init__(self, engine, marker: str) -> None:
        self.engine, self.marker = engine, marker

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def session(self, config):
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return self.engine.session(config)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class KillOnce:
    setup: object
    marker: str

    def __call__(self):
        runner = self.setup()
        runner.engine = KillingEngine(runner.engine, self.marker)
        return runner


@pytest.mark.slow
def test_two_actors_record_every_run_once_redo_a_killed_actors_run_and_resume(tmp_path, fixture_set, cluster):
    from kvagent.cli.eval.ray import EngineSetup, NodeCheck

    instances, repos = fixture_set
    instances = instances[:1]
    by_id = {i.instance_id: i for i in instances}
    specs = plan_runs(list(by_id), ["full", "random"], ["persistent", "reprefill"], [2048], [0])
    assert len(specs) == 4  # {full, random} x 2 modes; full runs once
    run_dir = tmp_path / "run"
    # two episodes at once per actor: a threaded actor over one batched engine (max_batch=2)
    setup = EngineSetup(EngineOptions(model="tiny-random-qwen3"), by_id, "local", str(repos), grade=True, concurrency=2,
                        agent_config=AgentConfig(max_steps=1, max_new_tokens=8))  # fmt: skip
    events: list[tuple[str, int, str | None]] = []
    executor = RayExecutor(
        KillOnce(setup, str(tmp_path / "killed")), run_dir=run_dir, engines=2, concurrency=2,
        max_restarts=0, preflight=NodeCheck(instances, "local", str(repos)),
        on_event=lambda ev, i, run, _: events.append((ev, i, run.run_id if run else None)),
    )  # fmt: skip
    driver = EvalRunner(run_dir=run_dir, engine=None, instances=by_id, open_env=None, model_name="tiny")
    records = driver.run(specs, execute=executor)

    lines = [json.loads(x) for x in (run_dir / RUNS_FILE).read_text().splitlines()]
    ids = [r["run_id"] for r in lines]
    assert sorted(ids) == sorted(s.run_id for s in specs) and len(set(ids)) == len(ids) == 4
    assert all(r["exit_status"] != "error" for r in records), [r["error"] for r in records]
    killed = {rid: i for ev, i, rid in events if ev == "requeued"}  # the runs in flight on the killed actor
    dead = set(killed.values())
    assert killed and len(dead) == 1 and ("dead", *dead, None) in events  # one actor died, mid-episode
    for victim in killed:  # each was redone on the other actor, and finished once
        assert [i for ev, i, rid in events if ev == "finished" and rid == victim] == [1 - next(iter(dead))]
    assert sum(1 for ev, *_ in events if ev == "finished") == 3  # 3 executed runs, each finished once
    for rec in lines:  # the actors' trajectories and grading logs reached the driver's run directory
        assert rec["grade_status"] in ("resolved", "unresolved")
        assert (run_dir / rec["trajectory"]).is_file()
        assert "derived_from" in rec or any((run_dir / "grading" / rec["run_id"]).iterdir())
    assert (run_dir / "predictions" / "random__persistent__K2048__recent-buffer__s0.jsonl").read_text().count(
        "\n"
    ) == 1
    assert not list((tmp_path / "run").rglob("*.tmp"))
    killed_pid = (tmp_path / "killed").read_text()  # its episode's temp dir is swept, as a restart would
    assert killed_pid in {p.name.split("-")[2] for p in sweep_stale_run_dirs()}
    assert not list(Path(tempfile.gettempdir()).glob(f"kvagent-run-{killed_pid}-*"))

    # the same command again: nothing is repeated, no actor even starts
    again: list[str] = []
    rerun = RayExecutor(setup, run_dir=run_dir, engines=2, on_event=lambda ev, *_: again.append(ev))
    EvalRunner(run_dir=run_dir, engine=None, instances=by_id, open_env=None).run(specs, execute=rerun)
    assert again == [] and (run_dir / RUNS_FILE).read_text().count("\n") == 4
    assert len(load_records(run_dir)) == 4


@pytest.mark.slow
def test_a_killed_actor_restarted_by_ray_reloads_its_engine_and_redoes_the_run(
    tmp_path, fixture_set, cluster
):
    from kvagent.cli.eval.ray import EngineSetup

    instances, repos = fixture_set
    by_id = {instances[0].instance_id: instances[0]}
    specs = plan_runs(list(by_id), ["random"], ["persistent"], [2048], [0, 1])
    setup = EngineSetup(EngineOptions(model="tiny-random-qwen3"), by_id, "local", str(repos), grade=False,
                        agent_config=AgentConfig(max_steps=1, max_new_tokens=8))  # fmt: skip
    events: list[tuple[str, str | None]] = []
    executor = RayExecutor(KillOnce(setup, str(tmp_path / "killed")), run_dir=tmp_path / "run", engines=1,
                           max_restarts=1, on_event=lambda ev, i, run, _: events.append((ev, run and run.run_id)))  # fmt: skip
    EvalRunner(run_dir=tmp_path / "run", engine=None, instances=by_id, open_env=None).run(
        specs, execute=executor
    )
    victim = next(rid for ev, rid in events if ev == "requeued")
    after = events[events.index(("requeued", victim)) :]
    assert ("lost", None) in after and ("ready", None) in after and ("finished", victim) in after
    assert "dead" not in [ev for ev, _ in events]
    killed_pid = (tmp_path / "killed").read_text()  # the restarted actor swept its predecessor's temp dir
    assert not list(Path(tempfile.gettempdir()).glob(f"kvagent-run-{killed_pid}-*"))
    ids = [json.loads(x)["run_id"] for x in (tmp_path / "run" / RUNS_FILE).read_text().splitlines()]
    assert sorted(ids) == sorted(s.run_id for s in specs)


@pytest.mark.slow
def test_missing_images_on_a_node_fail_before_the_first_run(tmp_path, fixture_set, cluster):
    from kvagent.cli.eval.ray import EngineSetup, NodeCheck
    from tests.helpers import require_docker

    require_docker()  # the node check asks Docker which images it holds
    instances, repos = fixture_set
    by_id = {i.instance_id: i for i in instances}
    specs = plan_runs(list(by_id), ["random"], ["persistent"], [2048], [0])
    setup = EngineSetup(EngineOptions(model="tiny-random-qwen3"), by_id, "docker")
    events: list[str] = []
    executor = RayExecutor(setup, run_dir=tmp_path / "run", engines=1, preflight=NodeCheck(instances, "docker"),
                           on_event=lambda ev, *_: events.append(ev))  # fmt: skip
    driver = EvalRunner(run_dir=tmp_path / "run", engine=None, instances=by_id, open_env=None)
    with pytest.raises(KvagentError) as err:
        driver.run(specs, execute=executor)
    message = str(err.value)
    assert message.startswith("engine 0 on node") and "\n" not in message
    assert "no image for 2 instance(s)" in message and "kvagent images build" in message
    assert "--image-registry" in message
    assert "start" not in events and not (tmp_path / "run" / RUNS_FILE).exists()

    too_many = RayExecutor(setup, run_dir=tmp_path / "run", engines=3)  # 3 CPU engines on 2 CPUs
    with pytest.raises(ConfigError, match="needs 3 CPUs; the Ray cluster has 2"):
        list(too_many(plan_runs(list(by_id), ["random"], ["persistent"], [2048], [0, 1])))  # 4 runs


@pytest.mark.slow
def test_kvagent_eval_ray_cli_runs_resumes_and_reports(tmp_path, fixture_set, cluster):
    """`kvagent eval --ray auto --engines 2` end to end on the connected cluster, then again: the
    second invocation finds every run finished and starts no engine."""
    from typer.testing import CliRunner

    from kvagent.cli.app import app

    instances, repos = fixture_set
    dataset = tmp_path / "set.jsonl"
    dataset.write_text(json.dumps(instances[0].to_record()) + "\n")
    out = tmp_path / "run"
    args = ["eval", "--dataset", str(dataset), "--env", "local", "--repos", str(repos),
            "--model", "tiny-random-qwen3", "--policies", "random", "--modes", "persistent",
            "--budgets", "2048", "--seeds", "0,1", "--max-steps", "1", "--max-new-tokens", "8",
            "--no-grade", "--out", str(out), "--ray", "auto", "--engines", "2"]  # fmt: skip
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "Ray: 2 engine(s)" in first.output and cluster.is_initialized()  # the test's cluster kept
    lines = (out / RUNS_FILE).read_text().splitlines()
    assert len(lines) == 2 and {json.loads(x)["seed"] for x in lines} == {0, 1}
    second = CliRunner().invoke(app, args)
    assert second.exit_code == 0 and "2 already finished" in second.output and "Ray:" not in second.output
    assert (out / RUNS_FILE).read_text().splitlines() == lines
    assert (out / "report.md").exists() and (out / "grid.yaml").exists()  # as a local eval writes them
