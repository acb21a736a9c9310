"""`kvagent eval` checks its whole grid before the first episode (issue 16, point 1): a bad setting is
one line naming it, exit 2, and nothing recorded, so a rerun with the flag fixed runs everything.
The engine is a scripted double (no model load); sandboxes are local."""

import json
import re

import pytest
from typer.testing import CliRunner

from kvagent.cli.app import app
from kvagent.evals.datasets import Instance
from kvagent.testing import CALC_PY, ScriptedEngine, git_repo
from tests.helpers import SUBMIT


@pytest.fixture()
def mini(tmp_path):
    """Two instances with local checkouts, as a dataset file."""
    repos = tmp_path / "repos"
    records = []
    for n in (1, 2):
        iid = f"fixture__calc-{n}"
        inst = Instance(
            instance_id=iid,
            repo="fixture/calc",
            base_commit=git_repo(repos / iid, {"calc.py": CALC_PY}),
            problem_statement="add() subtracts instead of adding " * (40 * n),
            test_patch="diff --git a/t.py b/t.py\n",
            FAIL_TO_PASS=["t.py::test_add"],
            PASS_TO_PASS=[],
        )
        records.append(json.dumps(inst.to_record()))
    dataset = tmp_path / "mini.jsonl"
    dataset.write_text("\n".join(records) + "\n")
    return dataset, repos


@pytest.fixture()
def engine(monkeypatch, qwen3_tokenizer):
    """The scripted engine `kvagent eval` loads; `loads` records load_engine's arguments."""
    eng = ScriptedEngine(qwen3_tokenizer, lambda config: [SUBMIT])
    eng.loads = []

    def load(engine, **kw):
        eng.loads.append(kw)
        return eng

    monkeypatch.setattr("kvagent.cli.eval.run.load_engine", load)
    return eng


def base_args(mini, out):
    dataset, repos = mini
    return [
        "eval", "--dataset", str(dataset), "--env", "local", "--repos", str(repos), "--isolation", "none",
        "--model", "scripted", "--policies", "full,random", "--modes", "persistent", "--budgets", "4096",
        "--max-steps", "2", "--no-grade", "--out", str(out),
    ]  # fmt: skip


def invoke(args):
    return CliRunner().invoke(app, args)


def one_line_error(result, *words):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    err = lines[-1]  # progress lines may come first; the error is one line, the last
    assert err.startswith("kvagent: error: ") and sum(x.startswith("kvagent: error") for x in lines) == 1, (
        result.stderr
    )
    for w in words:
        assert w in err, err
    return err


def test_a_negative_temperature_fails_before_any_run_and_the_fixed_rerun_runs(mini, engine, tmp_path):
    out = tmp_path / "run"
    bad = invoke([*base_args(mini, out), "--temperature", "-1"])
    one_line_error(bad, "temperature")
    assert engine.sessions == 0 and not (out / "runs.jsonl").exists()

    good = invoke([*base_args(mini, out), "--temperature", "0"])
    assert good.exit_code == 0, good.output
    assert "0 already finished" in good.stderr
    lines = (out / "runs.jsonl").read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(x)["exit_status"] == "submitted" for x in lines)


def test_a_budget_below_the_protected_prompt_names_the_setting_and_the_real_prompt(mini, engine, tmp_path):
    out = tmp_path / "run"
    # the default protect=prompt with a budget far below the ~1,200-token first prompt
    args = [a if a != "4096" else "1024" for a in base_args(mini, out)]
    err = one_line_error(invoke(args), "random__persistent__K1024", "fixture__calc-2", "--budgets")
    assert not (out / "runs.jsonl").exists() and not (out / "trajectories").exists()
    # the advice is the prompt the sandbox really shows (checked against the episode's own first append)
    said = int(err.split("protects all ")[1].split(" ")[0])
    fixed = invoke([*args[:-2], "--out", str(tmp_path / "ok"), "--protect", "sink"])
    assert fixed.exit_code == 0, fixed.output
    traj = json.loads(next((tmp_path / "ok" / "trajectories").glob("fixture__calc-2__random*")).read_text())
    assert abs(traj["prompt_tokens"] - said) <= 8  # the sandbox's temp dir name differs by a few tokens


@pytest.mark.parametrize(("budget", "framework"), [("0.5", "recent-buffer"), ("0.9", "topk-all")])
def test_a_fraction_budget_with_a_protected_prompt_fails_before_the_sandbox(
    mini, engine, tmp_path, budget, framework
):
    out = tmp_path / "run"
    args = [a if a != "4096" else budget for a in base_args(mini, out)]
    one_line_error(invoke([*args, "--framework", framework]), f"K{budget}", "protect=prompt")
    assert not (out / "trajectories").exists()


def test_a_fraction_budget_fits_the_prompt_once_the_recent_buffer_delays_the_first_round(
    mini, engine, tmp_path
):
    # K = 0.9 L: topk-all's first round comes at L = K + r (~1,280 tokens, K below the ~1,500-token
    # prompt); recent-buffer's at K + 2r (2,560 tokens, K = 2,304 above it), so the same grid runs.
    out = tmp_path / "run"
    args = [a if a != "4096" else "0.9" for a in base_args(mini, out)]
    ran = invoke([*args, "--framework", "recent-buffer"])
    assert ran.exit_code == 0, ran.output
    assert len((out / "runs.jsonl").read_text().splitlines()) == 4


def test_a_budget_at_the_sink_fails_before_the_sandbox(mini, engine, tmp_path):
    out = tmp_path / "run"
    args = [a if a != "4096" else "4" for a in base_args(mini, out)]
    one_line_error(invoke([*args, "--protect", "sink"]), "protect=sink")
    assert not (out / "trajectories").exists()


@pytest.mark.parametrize(
    ("arg", "words"),
    [("nexus.bogus=1", ["bogus", "lam"]), ("nexsu.lam=1", ["nexsu", "nexus.lam=1"])],
)
def test_bad_policy_arguments_fail_before_the_model_loads(mini, engine, tmp_path, arg, words):
    out = tmp_path / "run"
    args = [a if a != "full,random" else "nexus" for a in base_args(mini, out)]
    one_line_error(invoke([*args, "--policy-arg", arg]), *words)
    assert engine.loads == [] and not out.exists()


def test_a_missing_instance_image_fails_before_the_model_loads(mini, engine, tmp_path, monkeypatch):
    monkeypatch.setattr("kvagent.sandbox.docker_backend.docker_client", lambda *a, **k: object())
    monkeypatch.setattr("kvagent.sandbox.images.image_exists", lambda tag, client=None: False)
    monkeypatch.setattr("kvagent.evals.images.image_exists", lambda tag, client=None: False)
    out = tmp_path / "run"
    args = [a if a != "local" else "docker" for a in base_args(mini, out)]
    one_line_error(
        invoke(args), "fixture__calc-1", "kvagent images build --instances fixture__calc-1,fixture__calc-2"
    )
    assert engine.loads == [] and not (out / "runs.jsonl").exists()


def test_policy_arg_without_policy_with_one_policy_and_with_several(mini, engine, tmp_path):
    """Point 6: KEY=VALUE goes to the one tunable policy; with several the error asks for POLICY.KEY."""
    args = [a if a != "full,random" else "full,nexus" for a in base_args(mini, tmp_path / "one")]
    ok = invoke([*args, "--budgets", "2048", "--policy-arg", "lam=0.5"])
    assert ok.exit_code == 0, ok.output
    rec = [json.loads(x) for x in (tmp_path / "one" / "runs.jsonl").read_text().splitlines()]
    assert {r["policy"] for r in rec} == {"full", "nexus"}
    args = [a if a != "full,random" else "random,nexus" for a in base_args(mini, tmp_path / "two")]
    one_line_error(invoke([*args, "--policy-arg", "lam=0.5"]), "POLICY.KEY=VALUE", "nexus.lam=0.5")


def test_concurrency_loads_one_batched_engine_and_records_every_run_once(mini, engine, tmp_path):
    out = tmp_path / "run"
    args = [*base_args(mini, out), "--seeds", "0,1", "--concurrency", "4"]
    result = invoke(args)
    assert result.exit_code == 0, result.output
    assert engine.loads[0]["max_batch"] == 4
    ids = [json.loads(x)["run_id"] for x in (out / "runs.jsonl").read_text().splitlines()]
    assert len(ids) == 8 == len(set(ids))
    # the deprecated name still works, and says so
    again = invoke([*args[:-2], "--workers", "2"])
    assert again.exit_code == 0 and "deprecated" in again.stderr and "8 already finished" in again.stderr


def test_the_live_table_counts_errors_apart_and_shows_an_eta():
    from rich.console import Console

    from kvagent.cli.eval.run import EvalTable
    from kvagent.evals.runner import plan_runs

    specs = plan_runs(["a", "b", "c"], ["random"], ["persistent"], [4096], [0])
    console = Console(record=True, width=200)
    table = EvalTable(specs, {}, console)
    table.started -= 60  # a minute into the batch
    assert "ETA after the first run" in table.render().caption
    table("start", specs[0], None)
    table("done", specs[0], {"run_id": specs[0].run_id, "resolved": True, "exit_status": "submitted"})
    table("start", specs[1], None)
    table("done", specs[1], {"run_id": specs[1].run_id, "infra_error": True, "exit_status": "error"})
    console.print(table.render())
    text = console.export_text()
    assert "errors" in text and "1/3" in text  # one done, one error (not done), one left
    row = next(line for line in text.splitlines() if "random__persistent__K4096" in line)
    assert [c.strip() for c in row.split("│")[2:6]] == [
        "1/3",
        "0",
        "1",
        "1",
    ]  # done, running, errors, resolved
    caption = table.render().caption
    assert (
        re.search(r"^1 runs left, ETA 3\d s", caption) and "1 infrastructure errors" in caption
    )  # 2 in 60 s


def test_infrastructure_errors_exit_non_zero_and_are_redone_by_the_rerun(mini, engine, tmp_path, monkeypatch):
    from kvagent.cli import environments
    from kvagent.sandbox.errors import SandboxError

    working = environments.local_env

    def broken(repos, isolation="bwrap"):
        def open_env(instance):
            raise SandboxError("the sandbox could not start")

        return open_env

    out = tmp_path / "run"
    monkeypatch.setattr(environments, "local_env", broken)
    failed = invoke(base_args(mini, out))
    one_line_error(failed, "4 of 4 runs hit infrastructure errors", "rerun")
    assert "4 runs hit infrastructure errors" in (out / "report.md").read_text()

    monkeypatch.setattr(environments, "local_env", working)
    again = invoke(base_args(mini, out))
    assert again.exit_code == 0 and "0 already finished" in again.stderr
    assert "infrastructure errors" not in (out / "report.md").read_text()
