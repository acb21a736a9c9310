"""Issue 24: a test command that could not run is an environment error, recorded apart and named
in the report, never `unresolved`; a patch that breaks the tests' import is still the patch's
failure (the gold patch, run as a control, shows the image can run them). Local sandboxes."""

from __future__ import annotations

import sys

import pytest

from kvagent.agent import AgentConfig
from kvagent.cli.environments import local_env, local_grader
from kvagent.evals.datasets import Instance
from kvagent.evals.env_errors import could_not_run
from kvagent.evals.grading import grade_instance
from kvagent.evals.report import write_report
from kvagent.evals.runner import EvalRunner, plan_runs
from kvagent.testing import CALC_PY, ScriptedEngine, calc_record, git_repo
from tests.helpers import SUBMIT

PYTEST = f"{sys.executable} -m pytest -rA -p no:cacheprovider"
GOLD = """\
diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""
SYNTAX_ERROR = GOLD.replace("+    return a + b", "+    return a +")


def _log(body: str, code: int | None) -> str:
    tail = f">>>>> Test Exit Code: {code}\n" if code is not None else ""
    return f"+ cd /testbed\n>>>>> Start Test Output\n{body}\n>>>>> End Test Output\n{tail}"


@pytest.mark.parametrize(
    ("body", "code", "reason"),
    [
        ("/x/eval.sh: line 40: bin/test: No such file or directory", 127, "test runner not found: bin/test (exit 127)"),
        ("/x/eval.sh: line 9: pytest: command not found", 127, "test runner not found: pytest (exit 127)"),
        (
            "python: can't open file '/testbed/tests/runtests.py': [Errno 2] No such file or directory",
            2,
            "test runner not found: /testbed/tests/runtests.py (exit 2)",
        ),
        ("/opt/venv/bin/python: No module named pytest", 1, "test runner not installed: pytest (exit 1)"),
        (
            "ERROR: dbshell.test_postgresql (unittest.loader._FailedTest)\n"
            "ImportError: Failed to import test module: dbshell.test_postgresql",
            1,
            "test module did not import: dbshell.test_postgresql (exit 1)",
        ),
        (
            "_____ ERROR collecting tests/test_x.py _____\nE   ModuleNotFoundError: No module named 'numpy'",
            2,
            "test module did not collect: tests/test_x.py (exit 2)",
        ),
        ("sympy/physics/tests/test_units.py[?]   Failed to import                [FAIL]", 1,
         "test module did not import: sympy/physics/tests/test_units.py (exit 1)"),
        ("", 126, "the test command could not be run (exit 126)"),
    ],
)  # fmt: skip
def test_each_kind_of_could_not_run(body, code, reason):
    assert could_not_run(_log(body, code), missing=["t"], total=1) == reason


def test_tests_that_ran_are_never_an_environment_error():
    log = _log("/x/eval.sh: line 40: bin/test: No such file or directory", 127)
    assert could_not_run(log, missing=[], total=3) is None  # every name has a result
    assert (
        could_not_run(_log("FAILED t.py::test_a - assert 1 == 2", 1), missing=["t.py::test_a"], total=1)
        is None
    )


def _calc(tmp_path, *, calc_py=CALC_PY, test_cmd=PYTEST, iid="fixture__calc-1") -> Instance:
    """The calc fixture with GOLD as its gold patch; `calc_py` committed over the fixture's source."""
    repos = tmp_path / "repos"
    rec = calc_record(repos, iid, patch=GOLD, test_cmd=test_cmd)
    if calc_py != CALC_PY:
        rec["base_commit"] = git_repo(repos / iid, {"calc.py": calc_py})
    return Instance.from_record(rec)


def test_a_test_command_that_exits_127_is_an_environment_error(tmp_path):
    inst = _calc(tmp_path, test_cmd="bin/test -C --verbose")  # sympy's runner, absent from the sdist
    for patch in (GOLD, "", SYNTAX_ERROR):
        d = grade_instance(
            inst, patch, open_env=local_env(tmp_path / "repos", "none"), log_dir=tmp_path / "g"
        )
        assert d["status"] == "env_error" and d["resolved"] is False, d
        assert d["env_error"] == "test runner not found: bin/test (exit 127)"
        assert d["error"] == "environment error: test runner not found: bin/test (exit 127)"
        assert d["infra"] is True
        # For any patch but the gold one, the gold patch was tried as the control, and failed the same.
        assert d.get("gold_control") == (None if patch == GOLD else "tests cannot run")


def test_a_missing_dependency_is_an_environment_error(tmp_path):
    inst = _calc(tmp_path, calc_py="import kvagent_no_such_module\n" + CALC_PY)
    d = grade_instance(inst, GOLD, open_env=local_env(tmp_path / "repos", "none"))
    assert d["status"] == "env_error" and d["env_error"].startswith(
        "test module did not collect: test_calc.py"
    )


def test_a_patch_that_breaks_the_import_is_unresolved_not_an_environment_error(tmp_path):
    inst = _calc(tmp_path)
    d = grade_instance(
        inst, SYNTAX_ERROR, open_env=local_env(tmp_path / "repos", "none"), log_dir=tmp_path / "g"
    )
    assert d["status"] == "unresolved", d
    assert d["env_error"] is None and not d.get("infra")
    assert d["gold_control"] == "tests run"  # the image runs the tests; this patch broke them
    assert (tmp_path / "g" / "gold_control_output.txt").read_text().count(
        "PASSED test_calc.py::test_add"
    ) == 1
    assert grade_instance(inst, GOLD, open_env=local_env(tmp_path / "repos", "none"))["status"] == "resolved"


def test_the_run_record_and_the_report_name_an_environment_error(tmp_path, qwen3_tokenizer):
    """No policy is charged: the run is an infra error (left out of Pass@1, redone next time), its
    record says why, and the report names the instance and the reason."""
    inst = _calc(tmp_path, test_cmd="bin/test -C --verbose")
    ok = _calc(tmp_path, iid="fixture__calc-2")
    instances = {inst.instance_id: inst, ok.instance_id: ok}
    run_dir = tmp_path / "run"
    runner = EvalRunner(
        run_dir=run_dir, engine=ScriptedEngine(qwen3_tokenizer, lambda c: [SUBMIT]), instances=instances,
        open_env=local_env(tmp_path / "repos", "none"), grade=local_grader(tmp_path / "repos", "none"),
        agent_config=AgentConfig(max_steps=2), model_name="scripted",
    )  # fmt: skip
    records = {
        r["instance_id"]: r
        for r in runner.run(plan_runs(list(instances), ["full"], ["persistent"], [None], [0]))
    }
    bad = records[inst.instance_id]
    assert bad["infra_error"] is True and bad["grade_status"] == "env_error"
    assert bad["env_error"] == "test runner not found: bin/test (exit 127)"
    assert (
        records[ok.instance_id]["grade_status"] == "unresolved"
        and records[ok.instance_id]["env_error"] is None
    )
    summary = write_report(run_dir)
    assert summary["env_errors"] == {inst.instance_id: "test runner not found: bin/test (exit 127)"}
    (row,) = summary["configs"]
    assert row["n_errors"] == 1 and row["n_instances"] == 1  # the broken image's run is not a 0
    text = (run_dir / "report.md").read_text()
    assert "**Environment errors on 1 instances**" in text
    assert f"{inst.instance_id}: test runner not found: bin/test (exit 127)" in text


def test_the_report_names_runs_whose_environment_differs(tmp_path):
    import json

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    base = {"policy": "full", "mode": "persistent", "budget": None, "seed": 0, "resolved": True}
    runs = [
        {**base, "run_id": "a", "instance_id": "o__a-1", "environment": "environment differs: python 3.9 (spec 3.10)"},
        {**base, "run_id": "b", "instance_id": "o__b-2", "environment": None},
    ]  # fmt: skip
    (run_dir / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    summary = write_report(run_dir)
    assert summary["environment_differs"] == {"o__a-1": "environment differs: python 3.9 (spec 3.10)"}
    text = (run_dir / "report.md").read_text()
    assert (
        "o__a-1: environment differs: python 3.9 (spec 3.10)" in text and "o__b-2" not in text.split("|")[0]
    )
