"""End to end, with Docker: django instances (not pytest-based) are built offline from their recipes
and graded with swebench's own eval script (runtests.py with a dotted label): the gold patch
resolves, the empty patch does not, and the FAIL_TO_PASS test fails before the gold patch (about 2
minutes each, cold). Django 5.0's spec names Python 3.11, Django 4.2's 3.9 (names without the
method, as unittest printed them before 3.11): each image runs its spec's."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvagent.cli.environments import check_sandbox
from kvagent.evals.check import check_instance, format_report
from kvagent.evals.datasets import load_instances
from tests.helpers import require_docker

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data" / "harness_instances.jsonl"
IID = "django__django-16595"


@pytest.fixture(scope="module")
def client():
    return require_docker()


def _python(client, image: str) -> str:
    out = client.containers.run(image, ["python", "--version"], network_mode="none", remove=True)
    return out.decode().split()[1].rsplit(".", 1)[0]


def test_a_django_4x_image_runs_the_specs_python_and_verifies(client, tmp_path):
    (inst,) = load_instances(DATA, select="django__django-15851")
    report = check_instance(inst, open_image=check_sandbox, out_dir=tmp_path)
    assert report["ok"] and report["tests_found"], format_report(report)
    assert _python(client, report["image"]) == "3.9" and report["environment"] is None
    gold_log = (tmp_path / inst.instance_id / "gold" / "test_output.txt").read_text()
    assert "test_parameters (dbshell.test_postgresql.PostgreSqlDbshellCommandTestCase) ... ok" in gold_log


def test_django_instance_verifies_end_to_end(client, tmp_path):
    (inst,) = load_instances(DATA, select=IID)
    report = check_instance(inst, open_image=check_sandbox, out_dir=tmp_path)
    assert report["ok"], format_report(report)
    assert _python(client, report["image"]) == "3.11"
    assert report["spec"]["test_command"].endswith("--parallel 1 migrations.test_optimizer")
    gold_log = (tmp_path / IID / "gold" / "test_output.txt").read_text()
    # The harness's runner ran, not pytest: django's verbose unittest lines, between the markers.
    assert "test_alter_alter_field (migrations.test_optimizer.OptimizerTests" in gold_log
    assert (
        "+ ./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 migrations.test_optimizer"
        in gold_log
    )
