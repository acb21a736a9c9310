"""Eval scripts come from swebench's own specs: the test command, the directives, the steps."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kvagent.errors import KvagentError
from kvagent.evals import specs
from kvagent.evals.datasets import Instance, load_instances
from kvagent.testing import git_repo

DATA = Path(__file__).parent / "data" / "harness_instances.jsonl"

# What swebench's spec for each instance's (repo, version) runs, written out by hand from the
# harness's constants so a change in how kvagent asks for them shows here.
EXPECTED = {
    "django__django-15851": "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 "
    "dbshell.test_postgresql",
    "django__django-16595": "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 "
    "migrations.test_optimizer",
    "sympy__sympy-24909": "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose "
    "sympy/physics/units/tests/test_prefixes.py",
    "pytest-dev__pytest-11148": "pytest -rA testing/acceptance_test.py testing/test_pathlib.py",
    "pydata__xarray-7393": "pytest -rA xarray/tests/test_indexes.py",
}


@pytest.fixture(scope="module")
def instances() -> dict[str, Instance]:
    return {i.instance_id: i for i in load_instances(DATA)}


@pytest.fixture(scope="module")
def harness(instances):
    return specs.harness_specs(instances.values())


@pytest.mark.parametrize("iid", sorted(EXPECTED))
def test_test_command_is_the_specs(harness, iid):
    spec = harness[iid]
    assert spec is not None and spec.origin.startswith("swebench-4.1.0")
    assert spec.test_command == EXPECTED[iid]
    # The harness's own script runs exactly that line between its markers.
    lines = list(spec.eval_script_list)
    start = next(n for n, ln in enumerate(lines) if "Start Test Output" in ln)
    assert lines[start + 1] == EXPECTED[iid]


def test_django_directives_are_dotted_labels(harness):
    assert harness["django__django-16595"].directives == ("migrations.test_optimizer",)


@pytest.mark.parametrize("iid", sorted(EXPECTED))
def test_adapted_script_keeps_the_harness_steps(harness, instances, iid):
    spec, inst = harness[iid], instances[iid]
    script = specs.adapt_eval_script(
        spec, base_commit=inst.base_commit, workdir="/work dir", base_ref="kvagent-base", install="INSTALL"
    )
    lines = script.splitlines()
    assert lines[:2] == ["#!/bin/bash", "set -uxo pipefail"]
    assert not any("conda" in ln or "/testbed" in ln for ln in lines)
    assert inst.base_commit not in script  # the sandbox's own base replaces the upstream commit
    assert "cd '/work dir'" in lines
    assert "INSTALL" in lines and (spec.install not in lines)
    # Test files are reset to the sandbox's base before and after, as the harness does.
    resets = [ln for ln in lines if ln.startswith("git checkout kvagent-base ")]
    assert len(resets) == 2
    run = lines.index(EXPECTED[iid])
    assert lines[run - 1] == ": '>>>>> Start Test Output'"
    assert lines[run + 1 : run + 4] == [
        "SWEBENCH_TEST_EXIT_CODE=$?",
        ": '>>>>> End Test Output'",
        'echo ">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE"',
    ]
    # The test_patch travels in the script (a heredoc) and a failure to apply it is announced.
    assert inst.test_patch.strip().splitlines()[0] in lines
    assert any(ln.endswith(f"|| echo '{specs.TEST_PATCH_FAILED}'") for ln in lines)


def test_install_none_drops_the_step_and_env_is_exported(harness, instances):
    spec, inst = harness["pytest-dev__pytest-11148"], instances["pytest-dev__pytest-11148"]
    script = specs.adapt_eval_script(
        spec, base_commit=inst.base_commit, install=None, env={"SETUPTOOLS_SCM_PRETEND_VERSION": "7.4.0"}
    )
    assert "pip install" not in script
    assert "export SETUPTOOLS_SCM_PRETEND_VERSION=7.4.0\n" in script


def test_script_runs_in_bash_and_applies_the_test_patch(tmp_path):
    """The adapted script is valid bash: on a tiny repo it applies the test patch, runs the test
    line between the markers, records its exit code and resets the test file."""
    repo = tmp_path / "repo"
    git_repo(repo, {"tests/t.txt": "old\n"})
    patch = "--- a/tests/t.txt\n+++ b/tests/t.txt\n@@ -1 +1 @@\n-old\n+new\n"
    spec = specs.HarnessSpec(
        "x__y-1",
        (
            "cd /testbed",
            "git config --global --add safe.directory /testbed",
            "git show",
            "git checkout UPSTREAM tests/t.txt",
            f"git apply -v - <<'EOF_1'\ndiff --git a/tests/t.txt b/tests/t.txt\n{patch}\nEOF_1",
            ": '>>>>> Start Test Output'",
            "grep -q new tests/t.txt",
            ": '>>>>> End Test Output'",
            "git checkout UPSTREAM tests/t.txt",
        ),
    )
    script = specs.adapt_eval_script(spec, base_commit="UPSTREAM", workdir=str(repo), base_ref="HEAD")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={"HOME": str(tmp_path)})
    log = out.stdout + out.stderr
    assert ">>>>> Test Exit Code: 0" in log
    assert specs.TEST_PATCH_FAILED not in log.replace(f"echo '{specs.TEST_PATCH_FAILED}'", "")
    assert (repo / "tests" / "t.txt").read_text() == "old\n"
    assert not (tmp_path / ".gitconfig").exists()  # safe.directory went through the environment


def test_record_eval_script_wins(instances):
    inst = instances["django__django-16595"]
    rec = Instance(**{**inst.__dict__, "extra": {"eval_script": "#!/bin/bash\nset -uxo pipefail\necho hi\n"}})
    rec.instance_id = "record__only-1"
    spec = specs.harness_spec(rec)
    assert spec is not None and spec.origin == "record" and spec.eval_script_list == ("echo hi",)
    with pytest.raises(KvagentError, match="End Test Output"):
        specs.adapt_eval_script(spec, base_commit="")


def test_unknown_version_has_no_spec(instances):
    inst = instances["django__django-16595"]
    odd = Instance(**{**inst.__dict__, "instance_id": "django__django-0", "version": "0.0"})
    assert specs.harness_spec(odd) is None
    with pytest.raises(KvagentError, match=r"no spec for django/django version '0.0'.*'test_cmd'"):
        specs.require_spec(odd)


def test_missing_specs_override_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv(specs.SPECS_ENV, str(tmp_path / "nope.whl"))
    with pytest.raises(KvagentError, match=specs.SPECS_ENV):
        specs.specs_source()
