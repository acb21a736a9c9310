"""Recipes, image names and the grading pieces that need no Docker."""

from __future__ import annotations

import json
import subprocess
import tarfile

import pytest

from kvagent.errors import KvagentError
from kvagent.evals.datasets import Instance
from kvagent.evals.grading import load_predictions
from kvagent.evals.image_context import unpack_archive
from kvagent.evals.images import instance_image_tag, official_image_name
from kvagent.evals.judging import eval_script, judge_log, log_parser_name, patch_files, patch_test_targets
from kvagent.evals.recipe import TEST_PYTEST, load_recipes, recipe_for, repo_test_command

MINI = {
    "pallets__flask-4992": "Flask==2.2.3",
    "pallets__flask-5063": "Flask==2.2.3",
    "pallets__flask-4045": "Flask==2.0.0",
    "marshmallow-code__marshmallow-1359": "marshmallow==3.0.0",
    "pydicom__pydicom-1694": "pydicom==2.3.0",
    "pydicom__pydicom-1256": "pydicom==2.1.0",
}


def test_shipped_recipes_cover_the_mini_set():
    recipes = load_recipes()
    for iid, sdist in MINI.items():
        r = recipes[iid]
        assert r.source == {"sdist": sdist}
        assert "pytest==7.4.4" in r.pins
        assert r.test_cmd == TEST_PYTEST
    assert "Jinja2==3.0.1" in recipes["pallets__flask-4045"].pins
    # The digest follows the content that goes into the image.
    assert recipes["pydicom__pydicom-1694"].digest() != recipes["pydicom__pydicom-1256"].digest()


def test_user_recipe_file_overrides_and_validates(tmp_path):
    f = tmp_path / "r.json"
    f.write_text(
        json.dumps(
            {
                "format": 1,
                "defaults": {"test_cmd": "pytest -rA"},
                "recipes": {
                    "pydicom__pydicom-1256": {
                        "repo": "pydicom/pydicom",
                        "source": {"git": "/m/pydicom"},
                        "pins": [],
                    },
                    "new__x-1": {"repo": "new/x", "source": {"sdist": "x==1.0"}, "pins": ["pytest"]},
                },
            }
        )
    )
    recipes = load_recipes([f])
    assert recipes["pydicom__pydicom-1256"].source == {"git": "/m/pydicom"}
    assert recipes["new__x-1"].test_cmd == "pytest -rA"
    assert recipes["pallets__flask-4992"].source == {"sdist": "Flask==2.2.3"}

    f.write_text(json.dumps({"recipes": {"a__b-1": {"repo": "a/b", "source": {"sdist": "b>=1"}}}}))
    with pytest.raises(KvagentError, match=r"a__b-1.*NAME==VERSION"):
        load_recipes([f])
    f.write_text(json.dumps({"recipes": {"a__b-1": {"repo": "a/b", "source": "b"}}}))
    with pytest.raises(KvagentError, match=r"a__b-1.*'source'"):
        load_recipes([f])
    with pytest.raises(KvagentError, match="not found"):
        load_recipes([tmp_path / "none.json"])
    with pytest.raises(KvagentError, match=r"no image recipe for instance 'zz__zz-1'"):
        recipe_for("zz__zz-1")


def test_image_names():
    assert instance_image_tag("Foo__Bar-12") == "kvagent/sweb.eval.foo__bar-12:latest"
    assert (
        official_image_name("pallets__flask-4992")
        == "swebench/sweb.eval.x86_64.pallets_1776_flask-4992:latest"
    )


def inst(repo="pallets/flask", iid="pallets__flask-9", test_patch="", f2p=(), p2p=()) -> Instance:
    return Instance(
        instance_id=iid,
        repo=repo,
        base_commit="abc",
        problem_statement="",
        test_patch=test_patch,
        FAIL_TO_PASS=list(f2p),
        PASS_TO_PASS=list(p2p),
    )


def test_test_command_fallbacks():
    assert repo_test_command(inst(iid="pallets__flask-4992")) == TEST_PYTEST
    assert repo_test_command(inst(repo="pytest-dev/pytest", iid="pytest-dev__pytest-1")) == TEST_PYTEST
    with pytest.raises(KvagentError, match="no test command known"):
        repo_test_command(inst(repo="django/django", iid="django__django-1"))


def test_unpack_sdist_strips_top_folder(tmp_path):
    src = tmp_path / "pkg-1.0"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("x = 1\n")
    (src / "setup.py").write_text("")
    archive = tmp_path / "pkg-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as t:
        t.add(src, arcname="pkg-1.0")
    dest = tmp_path / "out" / "testbed"
    dest.parent.mkdir()
    unpack_archive(archive, dest)
    assert (dest / "pkg" / "__init__.py").read_text() == "x = 1\n" and (dest / "setup.py").exists()


TEST_PATCH = """\
diff --git a/tests/static/config.toml b/tests/static/config.toml
new file mode 100644
--- /dev/null
+++ b/tests/static/config.toml
@@ -0,0 +1 @@
+A=1
diff --git a/tests/test_config.py b/tests/test_config.py
--- a/tests/test_config.py
+++ b/tests/test_config.py
@@ -1 +1 @@
-x
+y
"""


def test_patch_files_and_directives():
    assert patch_files(TEST_PATCH) == ["tests/static/config.toml", "tests/test_config.py"]
    assert patch_test_targets(TEST_PATCH) == ["tests/test_config.py"]  # data files are not run


def test_eval_script_shape_and_syntax(tmp_path):
    script = eval_script(inst(test_patch=TEST_PATCH), TEST_PYTEST)
    assert f"{TEST_PYTEST} tests/test_config.py\n" in script
    assert (
        script.index(">>>>> Start Test Output")
        < script.index(TEST_PYTEST)
        < script.index(">>>>> End Test Output")
    )
    assert "tests/static/config.toml" in script  # reset covers every touched file
    path = tmp_path / "eval.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


def _log(tmp_path, body: str, rc: int = 1):
    p = tmp_path / "log.txt"
    p.write_text(
        f"noise\n>>>>> Start Test Output\n{body}\n>>>>> End Test Output\n>>>>> Test Exit Code: {rc}\n"
    )
    return p


def test_judge_log_uses_swebench_rules(tmp_path):
    i = inst(f2p=["tests/t.py::test_new"], p2p=["tests/t.py::test_old", "tests/t.py::test_skip"])
    assert log_parser_name(i) == "parse_log_flask"
    ok = _log(
        tmp_path,
        "PASSED tests/t.py::test_new\nPASSED tests/t.py::test_old\nSKIPPED tests/t.py::test_skip",
        rc=0,
    )
    v = judge_log(i, "diff", ok)
    assert v["resolved"] is True and v["tests_status"]["FAIL_TO_PASS"]["success"] == ["tests/t.py::test_new"]
    bad = _log(tmp_path, "FAILED tests/t.py::test_new - AssertionError\nPASSED tests/t.py::test_old")
    v = judge_log(i, "diff", bad)
    assert v["resolved"] is False and v["tests_status"]["FAIL_TO_PASS"]["failure"] == ["tests/t.py::test_new"]
    broke = _log(tmp_path, "PASSED tests/t.py::test_new\nFAILED tests/t.py::test_old")
    assert judge_log(i, "diff", broke)["resolved"] is False
    missing = _log(tmp_path, "PASSED tests/t.py::test_old", rc=0)
    assert judge_log(i, "diff", missing)["resolved"] is False


def test_judge_log_ids_cut_at_first_space_as_the_parser_does(tmp_path):
    # pydicom's parser keeps the text up to the first space of a parametrized id; the dataset's ids
    # are cut the same way, so they still match.
    i = inst(repo="pydicom/pydicom", iid="pydicom__pydicom-9", f2p=["t.py::test_x[a"], p2p=[])
    log = _log(tmp_path, "PASSED t.py::test_x[a b]", rc=0)
    assert judge_log(i, "diff", log)["resolved"] is True


def test_load_predictions_formats(tmp_path):
    preds = [
        {"instance_id": "a__b-1", "model_patch": "p1", "model_name_or_path": "m"},
        {"instance_id": "a__b-2", "model_patch": None},
    ]
    jl = tmp_path / "p.jsonl"
    jl.write_text("".join(json.dumps(p) + "\n" for p in preds))
    assert set(load_predictions(jl)) == {"a__b-1", "a__b-2"}
    js = tmp_path / "p.json"
    js.write_text(json.dumps({p["instance_id"]: p for p in preds}))
    assert load_predictions(js)["a__b-1"]["model_patch"] == "p1"
    js.write_text(json.dumps(preds + preds[:1]))
    with pytest.raises(KvagentError, match="two predictions for 'a__b-1'"):
        load_predictions(js)
    js.write_text(json.dumps([{"instance_id": "a__b-1"}]))
    with pytest.raises(KvagentError, match="lacks field 'model_patch'"):
        load_predictions(js)


def test_official_harness_command_names_everything_the_harness_needs(tmp_path):
    from kvagent.evals.official import official_harness_command

    cmd = official_harness_command(
        "preds.jsonl", "princeton-nlp/SWE-bench_Lite", ["a__b-1", "c__d-2"], tmp_path, timeout=600
    )
    assert cmd[1:3] == ["-m", "swebench.harness.run_evaluation"]
    args = dict(zip(cmd[3::2], cmd[4::2], strict=False))
    assert args["--dataset_name"] == "princeton-nlp/SWE-bench_Lite"
    assert args["--predictions_path"] == "preds.jsonl" and args["--timeout"] == "600"
    assert cmd[-3:] == ["--instance_ids", "a__b-1", "c__d-2"]


def test_official_harness_rejects_a_missing_predictions_file(tmp_path):
    from kvagent.errors import KvagentError
    from kvagent.evals.official import run_official_harness

    with pytest.raises(KvagentError, match="predictions file .* not found"):
        run_official_harness(str(tmp_path / "nope.jsonl"), "x.jsonl", None, tmp_path)


def _wheel(dest, name, version, requires=()):
    import zipfile

    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(dest / f"{name}-{version}-py3-none-any.whl", "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta)


def test_wheelhouse_gets_what_the_images_python_needs_not_the_hosts(tmp_path):
    """pip evaluates markers for the host even with --python-version: on a 3.11 host it leaves out
    pytest's `exceptiongroup; python_version < "3.11"`, which a 3.9 image then cannot install."""
    from kvagent.evals.image_context import unmet_for_target

    _wheel(tmp_path, "pytest", "7.4.4", [
        "iniconfig", 'exceptiongroup>=1.0.0rc8; python_version < "3.11"', 'tomli>=1.0.0; python_version < "3.11"',
        'colorama; sys_platform == "win32"', 'xmlschema; extra == "testing"',
    ])  # fmt: skip
    _wheel(tmp_path, "iniconfig", "2.0.0")
    (tmp_path / "requirements.txt").write_text("pytest==7.4.4\n")
    assert unmet_for_target(tmp_path, "3.9") == ["exceptiongroup>=1.0.0rc8", "tomli>=1.0.0"]
    assert unmet_for_target(tmp_path, "3.11") == []
    _wheel(tmp_path, "tomli", "2.0.1")
    assert unmet_for_target(tmp_path, "3.9") == ["exceptiongroup>=1.0.0rc8"]


def test_wheel_platforms_reach_back_to_manylinux2014():
    """pip takes --platform tags literally: bullseye's list must name every older manylinux tag, or
    MarkupSafe 2.1.3 (manylinux_2_17 only) is 'not found' for Python 3.9."""
    from kvagent.evals.image_context import wheel_platforms

    tags = wheel_platforms("2_31")
    assert tags[0] == "manylinux_2_31_x86_64" and "manylinux_2_17_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64"} <= set(tags)
    assert "manylinux_2_36_x86_64" not in tags  # bookworm's glibc is newer than bullseye's
