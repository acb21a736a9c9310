"""End to end, with Docker: a django instance (not pytest-based) is built offline from its recipe and
graded with swebench's own eval script (runtests.py with a dotted label): the gold patch resolves, the
empty patch does not, and its FAIL_TO_PASS test fails before the gold patch (about 2 minutes cold)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvagent.cli.environments import check_sandbox
from kvagent.evals.check import check_instance, format_report
from kvagent.evals.datasets import load_instances
from kvagent.evals.images import BASE_TAG
from kvagent.sandbox.images import ensure_base_image
from tests.helpers import require_docker

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data" / "harness_instances.jsonl"
IID = "django__django-16595"


@pytest.fixture(scope="module")
def client():
    return require_docker()


def test_django_instance_verifies_end_to_end(client, tmp_path):
    ensure_base_image(BASE_TAG)
    (inst,) = load_instances(DATA, select=IID)
    report = check_instance(inst, open_image=check_sandbox, out_dir=tmp_path)
    assert report["ok"], format_report(report)
    assert report["spec"]["test_command"].endswith("--parallel 1 migrations.test_optimizer")
    gold_log = (tmp_path / IID / "gold" / "test_output.txt").read_text()
    # The harness's runner ran, not pytest: django's verbose unittest lines, between the markers.
    assert "test_alter_alter_field (migrations.test_optimizer.OptimizerTests" in gold_log
    assert (
        "+ ./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 migrations.test_optimizer"
        in gold_log
    )
