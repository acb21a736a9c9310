"""End to end, with Docker: build one offline mini-set image with the builder, then grade the gold patch
(resolved), an empty patch and a wrong patch (unresolved). Images are cached by tag + recipe digest, so
only the first run pays for the build (about 20 s, plus about a minute for the base rootfs if absent).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvagent.cli.environments import grading_sandbox
from kvagent.evals.datasets import load_instances
from kvagent.evals.grading import grade_instance, grade_predictions
from kvagent.evals.images import build_instance_image
from tests.helpers import require_docker

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data" / "marshmallow-1359.jsonl"
IID = "marshmallow-code__marshmallow-1359"

# Applies cleanly (a new file) but fixes nothing.
WRONG_PATCH = """\
diff --git a/src/marshmallow/unrelated.py b/src/marshmallow/unrelated.py
new file mode 100644
--- /dev/null
+++ b/src/marshmallow/unrelated.py
@@ -0,0 +1 @@
+ANSWER = 42
"""


@pytest.fixture(scope="module")
def client():
    return require_docker()


@pytest.fixture(scope="module")
def image(client):
    return build_instance_image(IID, client=client)


@pytest.fixture(scope="module")
def instance():
    (inst,) = load_instances(DATA)
    return inst


def test_image_has_clean_testbed_at_base(client, image):
    out = client.containers.run(
        image,
        [
            "bash",
            "-c",
            "cd /testbed && git status --porcelain && git rev-list --count HEAD && python -c 'import marshmallow; print(marshmallow.__version__)'",
        ],
        network_mode="none",
        remove=True,
    ).decode()
    assert out.split() == ["1", "3.0.0"]  # no changes, one base commit, the pinned source


def in_image(image, client):
    return lambda instance: grading_sandbox(instance, image=image, client=client)


def test_gold_empty_and_wrong_patches(client, image, instance, tmp_path):
    gold = grade_instance(
        instance, instance.patch, open_env=in_image(image, client), log_dir=tmp_path / "gold"
    )
    assert gold["status"] == "resolved", gold
    assert gold["apply_command"] == "git apply --verbose"
    assert gold["tests_status"]["FAIL_TO_PASS"]["success"] == instance.FAIL_TO_PASS

    empty = grade_instance(instance, "", open_env=in_image(image, client))
    assert empty["status"] == "unresolved" and empty["patch_is_empty"], empty
    # The tests did run: the new test fails at base, the old ones still pass.
    assert empty["tests_status"]["FAIL_TO_PASS"]["failure"] == instance.FAIL_TO_PASS
    assert not empty["tests_status"]["PASS_TO_PASS"]["failure"]

    wrong = grade_instance(instance, WRONG_PATCH, open_env=in_image(image, client))
    assert wrong["status"] == "unresolved" and wrong["patch_applied"], wrong

    garbage = grade_instance(
        instance,
        "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n",
        open_env=in_image(image, client),
    )
    assert garbage["status"] == "error" and "did not apply" in garbage["error"]
    # Every grading container is removed.
    assert not client.containers.list(all=True, filters={"label": "kvagent.role=grade"})


def test_grade_predictions_report(client, image, instance, tmp_path):
    preds = tmp_path / "preds.jsonl"
    preds.write_text(
        json.dumps({"instance_id": IID, "model_name_or_path": "m", "model_patch": WRONG_PATCH}) + "\n"
    )
    out = tmp_path / "grade"
    report = grade_predictions(preds, DATA, out_dir=out, open_env=grading_sandbox)
    assert report["unresolved_ids"] == [IID] and report["resolved_ids"] == [] and report["error_ids"] == []
    assert json.loads((out / "report.json").read_text())["unresolved_ids"] == [IID]
    assert (out / "logs" / IID / "test_output.txt").read_text().count(">>>>> End Test Output") == 1

    gold = grade_predictions("gold", DATA, instances=IID, out_dir=tmp_path / "gold", open_env=grading_sandbox)
    assert gold["resolved_ids"] == [IID] and gold["resolved_instances"] == 1
