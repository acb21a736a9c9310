"""Issue 16, points 4 and 10, and `eval --config`: bad input to grade, model loading and device is one
line (exit 2) instead of a traceback or a long wait; a grid file sets eval's options, flags override
it, and each run directory records its grid."""

import json
import struct
import time

import pytest
import yaml
from typer.testing import CliRunner

from kvagent.cli.app import app
from kvagent.errors import ConfigError, KvagentError
from kvagent.testing import ScriptedEngine
from tests.helpers import SUBMIT


def invoke(args):
    return CliRunner().invoke(app, args)


def one_line_error(result, *words):
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) >= 1 and lines[-1].startswith("kvagent: error: "), result.stderr
    assert sum(x.startswith("kvagent: error") for x in lines) == 1, result.stderr
    for w in words:
        assert w in lines[-1], lines[-1]
    return lines[-1]


# ------------------------------------------------------------------------------------------ grade
@pytest.fixture()
def no_docker_needed(monkeypatch):
    """Grading itself is replaced: these tests are about what is checked before it."""
    graded = []
    monkeypatch.setattr("kvagent.sandbox.docker_backend.docker_client", lambda *a, **k: object())

    def grade_instance(instance, patch, **kw):
        graded.append((instance.instance_id, patch, kw.get("recipes")))
        return {"status": "unresolved", "resolved": False, "patch_is_empty": not patch, "error": None}

    monkeypatch.setattr("kvagent.evals.grading.grade_instance", grade_instance)
    return graded


def test_grade_a_model_patch_that_is_not_a_string(mini, tmp_path, no_docker_needed):
    preds = tmp_path / "preds.jsonl"
    preds.write_text(json.dumps({"instance_id": "fixture__calc-1", "model_patch": 5}) + "\n")
    one_line_error(invoke(["grade", str(preds), "--dataset", str(mini[0])]), "model_patch", "int")
    assert no_docker_needed == []


def test_grade_an_empty_predictions_file(mini, tmp_path, no_docker_needed):
    preds = tmp_path / "preds.jsonl"
    preds.write_text("")
    one_line_error(invoke(["grade", str(preds), "--dataset", str(mini[0])]), "no predictions")


def test_grade_a_negative_timeout(mini, tmp_path, no_docker_needed):
    preds = tmp_path / "preds.jsonl"
    preds.write_text(json.dumps({"instance_id": "fixture__calc-1", "model_patch": ""}) + "\n")
    one_line_error(invoke(["grade", str(preds), "--dataset", str(mini[0]), "--timeout", "-5"]), "timeout")
    assert no_docker_needed == []


def test_grade_takes_recipes_as_images_build_does(mini, tmp_path, no_docker_needed):
    recipes = tmp_path / "recipes.json"
    recipe = {
        "repo": "fixture/calc",
        "source": {"git": str(mini[1] / "fixture__calc-1")},
        "test_cmd": "pytest t",
    }
    recipes.write_text(json.dumps({"format": 1, "recipes": {"fixture__calc-1": recipe}}))
    out = tmp_path / "grade-out"
    result = invoke(
        ["grade", "gold", "--dataset", str(mini[0]), "--recipes", str(recipes), "--out", str(out)]
    )
    assert result.exit_code == 0, (result.output, result.exception)
    ((iid, _, used),) = no_docker_needed
    assert iid == "fixture__calc-1" and used["fixture__calc-1"].test_cmd == "pytest t"
    one_line_error(
        invoke(["grade", "gold", "--dataset", str(mini[0]), "--recipes", str(tmp_path / "none.json")]),
        "none.json",
    )


# ------------------------------------------------------------------------------ models and devices
def test_a_truncated_gguf_with_a_valid_header_is_one_error(tmp_path):
    from kvagent.runtime.models import resolve

    path = tmp_path / "model.gguf"
    # magic, version 3, 0 tensors, 5 metadata entries ... and the file ends there
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 5) + struct.pack("<Q", 40) + b"general.arch")
    import torch

    with pytest.raises(KvagentError, match=r"^model: cannot read GGUF file .*model\.gguf .*truncated"):
        resolve(str(path), torch.float32)


def test_an_unknown_device_is_one_error():
    from kvagent.runtime.execution import resolve_device

    with pytest.raises(ConfigError, match=r"^device: got 'tpu'; use auto, cpu or cuda"):
        resolve_device("tpu")
    with pytest.raises(ConfigError, match="^device: "):
        resolve_device("cuda:x")


def test_eval_with_an_unknown_device_fails_before_the_model_loads(mini, tmp_path):
    dataset, repos = mini
    args = ["eval", "--dataset", str(dataset), "--env", "local", "--repos", str(repos), "--isolation", "none",
            "--model", "no/such-model", "--device", "tpu", "--no-grade", "--out", str(tmp_path / "run")]  # fmt: skip
    one_line_error(invoke(args), "device", "tpu")


def test_an_unknown_model_name_fails_at_once_when_the_hub_is_unreachable(monkeypatch):
    import torch
    from huggingface_hub import constants

    from kvagent.runtime.models import resolve

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on port 9
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    started = time.monotonic()
    with pytest.raises(KvagentError, match="^model: 'no-such-owner/no-such-model' .*cannot be reached"):
        resolve("no-such-owner/no-such-model", torch.float32)
    assert time.monotonic() - started < 10
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(KvagentError, match="HF_HUB_OFFLINE"):
        resolve("no-such-owner/no-such-model", torch.float32)


# ------------------------------------------------------------------------------------- --config
@pytest.fixture()
def engine(monkeypatch, qwen3_tokenizer):
    eng = ScriptedEngine(qwen3_tokenizer, lambda config: [SUBMIT])
    monkeypatch.setattr("kvagent.cli.eval.run.load_engine", lambda engine, **kw: eng)
    return eng


def test_a_grid_file_sets_the_options_flags_override_it_and_the_run_records_it(mini, tmp_path, engine):
    dataset, repos = mini
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        yaml.safe_dump(
            {
                "dataset": str(dataset), "env": "local", "repos": str(repos), "isolation": "none",
                "model": "scripted", "policies": ["full", "nexus"], "modes": ["persistent"],
                "budgets": [2048, 4096], "seeds": [0, 1], "max-steps": 2, "grade": False,
                "policy_arg": {"nexus": {"lam": 0.25}},
            }
        )
    )  # fmt: skip
    out = tmp_path / "run"
    result = invoke(["eval", "--config", str(grid), "--out", str(out), "--seeds", "3"])
    assert result.exit_code == 0, (result.output, result.exception)
    recs = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert sorted({(r["policy"], r["budget"]) for r in recs}, key=str) == sorted(
        {("full", None), ("nexus", 2048), ("nexus", 4096)}, key=str
    )
    assert {r["seed"] for r in recs} == {3}  # the flag overrides the file
    recorded = yaml.safe_load((out / "grid.yaml").read_text())
    assert recorded["seeds"] == "3" and recorded["policies"] == "full,nexus" and recorded["max_steps"] == 2
    assert recorded["policy_arg"] == ["nexus.lam=0.25"]
    traj = json.loads(next((out / "trajectories").glob("*nexus*")).read_text())
    assert traj["meta"]["cache_config"]["policy_args"] == {"lam": 0.25}

    # the recorded grid reproduces the run: nothing left to do
    again = invoke(["eval", "--config", str(out / "grid.yaml")])
    assert again.exit_code == 0 and f"{len(recs)} already finished" in again.stderr


def test_a_grid_file_with_unknown_keys_names_them(mini, tmp_path, engine):
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"dataset": str(mini[0]), "polices": "full", "budget": 1024}))
    err = one_line_error(invoke(["eval", "--config", str(grid)]), "polices", "budget")
    assert "valid keys" in err
    grid.write_text("policies: [full\n")
    one_line_error(invoke(["eval", "--config", str(grid)]), "not valid YAML")
    one_line_error(invoke(["eval", "--config", str(tmp_path / "missing.yaml")]), "missing.yaml")
