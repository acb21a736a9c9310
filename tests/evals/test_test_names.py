"""Issue 24: test names across interpreters. unittest prints qualified names since Python 3.11; the
log is respelt to the dataset's names before swebench's report is computed, so the same run
grades the same on either interpreter. The logs in data/django-15851/ are real: django 4.1's
runtests.py on the dbshell tests in kvagent images on Python 3.9 (the spec's) and 3.11, gold and
empty patch."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvagent.evals.datasets import load_instances
from kvagent.evals.judging import judge_log
from kvagent.evals.test_names import normalise_log, unittest_qualified

DATA = Path(__file__).parent / "data"
LOGS = DATA / "django-15851"
CLS = "dbshell.test_postgresql.PostgreSqlDbshellCommandTestCase"


@pytest.fixture(scope="module")
def django_4x():
    (inst,) = load_instances(DATA / "harness_instances.jsonl", select="django__django-15851")
    return inst


def _verdict(inst, name, patch):
    v = judge_log(inst, patch, LOGS / name)
    return v["resolved"], v["tests_status"], v["missing_tests"]


@pytest.mark.parametrize("run", ["gold", "empty"])
def test_a_python_311_log_grades_as_the_python_39_log_of_the_same_run(django_4x, run):
    patch = django_4x.patch if run == "gold" else ""
    assert f"test_accent ({CLS}.test_accent) ... ok" in (LOGS / f"py311-{run}.log").read_text()
    py39 = _verdict(django_4x, f"py39-{run}.log", patch)
    assert py39 == _verdict(django_4x, f"py311-{run}.log", patch)
    resolved, status, missing = py39
    assert resolved is (run == "gold") and missing == []
    if run == "empty":  # the fix's test fails before it, in either spelling
        assert status["FAIL_TO_PASS"]["failure"] == [f"test_parameters ({CLS})"]


def test_the_log_on_disk_is_left_as_the_tests_wrote_it(django_4x, tmp_path):
    log = tmp_path / "test_output.txt"
    text = (LOGS / "py311-gold.log").read_text()
    log.write_text(text)
    judge_log(django_4x, django_4x.patch, log)
    assert log.read_text() == text


# One test per known format: each spelling a runner prints, and the dataset's spelling it becomes.
NAMES = [f"test_accent ({CLS})", f"test_basic ({CLS})", "SIGINT is ignored in Python and passed to psql."]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (f"test_accent ({CLS}.test_accent) ... ok", f"test_accent ({CLS}) ... ok"),  # 3.11 result line
        (f"FAIL: test_accent ({CLS}.test_accent)", f"FAIL: test_accent ({CLS})"),  # 3.11 failure header
        (f"ERROR: test_basic ({CLS}.test_basic)", f"ERROR: test_basic ({CLS})"),
        (  # 3.11 subtest: the description head changes, the parameters stay
            f"test_accent ({CLS}.test_accent) (db='x') ... FAIL",
            f"test_accent ({CLS}) (db='x') ... FAIL",
        ),
        (  # 3.11 with a docstring: the name line changes, the docstring line the parser reads does not
            f"test_sigint ({CLS}.test_sigint)\nSIGINT is ignored in Python and passed to psql. ... ok",
            f"test_sigint ({CLS}.test_sigint)\nSIGINT is ignored in Python and passed to psql. ... ok",
        ),
        (f"test_accent ({CLS}) ... ok", f"test_accent ({CLS}) ... ok"),  # 3.9: already the dataset's
        (
            f"test_other ({CLS}.test_other) ... ok",
            f"test_other ({CLS}.test_other) ... ok",
        ),  # not a name of ours
        (
            "PASSED tests/test_x.py::test_a (slow)",
            "PASSED tests/test_x.py::test_a (slow)",
        ),  # pytest: untouched
    ],
)
def test_unittest_qualified_names(line, expected):
    assert normalise_log(line, NAMES) == expected


def test_names_recorded_on_311_match_a_39_log():
    """The other direction: django 5.x's names were recorded on 3.11 (`m (a.B.m)`); a log from an
    older interpreter is respelt to them."""
    names = ["test_alter_alter_field (migrations.test_optimizer.OptimizerTests.test_alter_alter_field)"]
    line = "test_alter_alter_field (migrations.test_optimizer.OptimizerTests) ... ok"
    assert normalise_log(line, names) == names[0] + " ... ok"


def test_canonical_spelling():
    assert unittest_qualified(f"test_a ({CLS}.test_a)") == f"test_a ({CLS})"
    assert unittest_qualified(f"test_a ({CLS})") == f"test_a ({CLS})"
    assert unittest_qualified("A docstring.") is None
