"""A new user's mistakes, from the command-line audit: each is one line naming the problem and the fix,
exit 2, no traceback, and it fails before the model loads (or anything slow starts)."""

import importlib
import json

import pytest
import yaml
from typer.testing import CliRunner

from kvagent.cli.app import app
from kvagent.cli.settings import EngineOptions
from kvagent.testing import git_repo

CALC_PY = "def add(a, b):\n    return a - b\n"


def invoke(args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line_error(result, *words, code=2):
    assert result.exit_code == code, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("kvagent: error: "), result.stderr
    assert sum(x.startswith("kvagent: error") for x in lines) == 1 and "Traceback" not in result.output
    for w in words:
        assert w in lines[-1], lines[-1]
    return lines[-1]


@pytest.fixture()
def no_model(monkeypatch):
    """Every command's model load fails the test: these mistakes must be caught before it."""

    def load(*a, **k):
        raise AssertionError("the model was loaded before the mistake was caught")

    # Imported first: a module imported while common's is patched would keep the patch as its own.
    names = ("common", "solve", "eval.run", "bench.run")
    modules = [importlib.import_module(f"kvagent.cli.{m}") for m in names]
    for module in modules:
        monkeypatch.setattr(module, "load_engine", load)


@pytest.fixture()
def repo(tmp_path):
    root = tmp_path / "repo"
    git_repo(root, {"calc.py": CALC_PY})
    return root


@pytest.fixture()
def a_file(tmp_path):
    path = tmp_path / "results"
    path.write_text("not a directory\n")
    return path


# ------------------------------------------------------------------------------- output directories
def test_an_output_dir_that_is_a_file_fails_before_any_work(no_model, a_file, repo, mini, tmp_path):
    dataset, repos = mini
    commands = [
        ["demo", "--model", "tiny-random-qwen3"],
        ["solve", "--issue", "x", "--repo", repo],
        ["eval", "--dataset", dataset, "--env", "local", "--repos", repos, "--isolation", "none", "--no-grade",
         "--policies", "full", "--modes", "persistent"],
        ["bench", "fidelity", "--model", "tiny-random-qwen3", "--quiet"],
        ["bench", "speed", "--model", "tiny-random-qwen3", "--quiet"],
        ["bench", "study", "--claim", "random", "--model", "tiny-random-qwen3", "--quiet"],
        ["images", "check", "--instances", "0:1", "--dataset", dataset],
        ["grade", "gold", "--dataset", dataset],
    ]  # fmt: skip
    for args in commands:
        err = one_line_error(invoke([*args, "--out", a_file]), "out: ", "is a file", "pass a directory")
        assert str(a_file) in err
    # a file further up: the directory could never be made
    one_line_error(invoke([*commands[1], "--out", a_file / "run"]), f"{a_file} is a file, so")


def test_an_unwritable_output_dir_fails_before_any_work(no_model, repo, tmp_path, monkeypatch):
    # As root every directory is writable, so the permission answer is what is faked here.
    monkeypatch.setattr("kvagent.cli.common.os.access", lambda path, mode: False)
    one_line_error(invoke(["solve", "--issue", "x", "--repo", repo, "--out", tmp_path / "new" / "run"]),
                   "out: ", "is not writable")  # fmt: skip


def test_inspect_html_is_checked_before_the_episode_is_shown(tmp_path, a_file):
    traj = tmp_path / "episode.traj.json"  # another scaffold's file: messages only
    traj.write_text(json.dumps({"messages": [{"role": "user", "content": "fix it"},
                                             {"role": "assistant", "content": "done"}]}))  # fmt: skip
    assert invoke(["inspect", traj]).exit_code == 0
    r = invoke(["inspect", traj, "--html", tmp_path])
    one_line_error(r, "html: ", "is a directory", "out.html")
    assert "episode" not in r.stdout  # nothing was printed before the error
    one_line_error(invoke(["inspect", traj, "--html", a_file / "page.html"]), "cannot write", "is a file")


# ------------------------------------------------------------------------------ the cache options
@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--policy", "snapkv"], ["--policy snapkv evicts only under a budget", "--budget 1024"]),
        (["--budget", "1024"], ["--policy full never evicts", "--policy snapkv"]),
        (["--policy", "snapkv", "--budget", "0"], ["budget: must be >= 1 token, got 0", "no budget"]),
        (["--policy", "snapkv", "--budget", "1024", "--policy-arg", "foo=1"], ["policy-arg: snapkv has no", "kernel"]),
        (["--temperature", "-1"], ["temperature: must be >= 0"]),
        (["--max-steps", "0"], ["max-steps: must be >= 1"]),
        (["--prompt-style", "x"], ["prompt-style: got 'x'"]),
    ],
    ids=["policy-without-budget", "budget-without-policy", "budget-0", "unknown-policy-arg", "temperature",
         "max-steps", "prompt-style"],
)  # fmt: skip
def test_solve_and_chat_check_their_options_before_the_model_loads(no_model, repo, args, needles):
    for command in (["solve", "--issue", "x"], ["chat"]):
        one_line_error(invoke([*command, "--repo", repo, *args]), *needles)


def test_a_cuda_device_where_there_is_none_names_the_options(monkeypatch):
    import torch

    from kvagent.cli.common import load_engine
    from kvagent.errors import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="^device: cuda:1 asked for, .* use --device cpu or auto$"):
        load_engine(EngineOptions(model="tiny-random-qwen3", device="cuda:1"))


# ------------------------------------------------------------------------------------------- demo
def test_demo_checks_budget_and_turns_before_generating(no_model):
    r = one_line_error(invoke(["demo", "--budget", "0"]), "budget: must be >= 1 token, got 0")
    r = invoke(["demo", "--turns", "3"])
    one_line_error(r, "turns: 3 is too short", "--turns 10")
    assert "generating" not in r.stdout


# ------------------------------------------------------------------------------------------- eval
def test_eval_checks_env_before_it_reads_the_dataset(no_model, tmp_path):
    missing = tmp_path / "missing.jsonl"
    one_line_error(invoke(["eval", "--dataset", missing, "--env", "loca"]), "env: got 'loca'")
    one_line_error(invoke(["eval", "--dataset", missing, "--env", "local"]), "--env local needs --repos")
    one_line_error(invoke(["eval", "--dataset", missing, "--isolation", "off"]), "isolation: got 'off'")


@pytest.mark.parametrize(
    ("grid", "needles"),
    [
        ({"max_steps": "many"}, ["max_steps must be a whole number, got 'many'"]),
        ({"grade": "maybe"}, ["grade must be true or false"]),
        ({"temperature": [1]}, ["temperature must be a number"]),
        ({"max_steps": None}, ["max_steps needs a value"]),
        ({"model": ["a", "b"]}, ["model must be text"]),
    ],
)
def test_a_grid_value_of_the_wrong_kind_names_the_file_and_key(no_model, mini, tmp_path, grid, needles):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"dataset": str(mini[0]), **grid}))
    one_line_error(invoke(["eval", "--config", path]), f"config: {path}: ", *needles)


def test_a_grid_number_for_a_text_option_is_taken_as_text():
    from kvagent.cli.eval.run import typed_grid

    assert typed_grid("g.yaml", {"model": 7, "max_new_tokens": None}, {"model": str, "max_new_tokens": int | None}) == {
        "model": "7", "max_new_tokens": None
    }  # fmt: skip


# ---------------------------------------------------------------------------------------- bench study
@pytest.mark.parametrize(
    ("args", "needles"),
    [
        ([], ["claim: none given", "--claim random or --claim nexus"]),
        (["--claim", "foo"], ["claim: got 'foo'", "random, nexus"]),
        (["--claim", "random", "--concurrency", "0"], ["concurrency: must be >= 1"]),
    ],
)
def test_study_options_name_themselves(no_model, args, needles):
    one_line_error(invoke(["bench", "study", "--model", "tiny-random-qwen3", *args]), *needles)


def test_study_takes_concurrency_as_eval_does_and_workers_still_works(no_model, monkeypatch):
    seen = {}
    monkeypatch.setattr("kvagent.cli.bench.run.run_study_bench", lambda **kw: seen.update(kw))
    assert invoke(["bench", "study", "--claim", "nexus", "--concurrency", "3"]).exit_code == 0
    assert seen["concurrency"] == 3 and seen["claim"] == "nexus"
    r = invoke(["bench", "study", "--claim", "random", "--workers", "2"])
    assert r.exit_code == 0 and seen["concurrency"] == 2 and "--workers is deprecated" in r.stderr
    assert "--workers" not in invoke(["bench", "study", "--help"]).stdout


# ----------------------------------------------------------------------------------- grade, images
def test_grade_checks_the_dataset_before_docker_and_explains_a_directory(mini, tmp_path, monkeypatch):
    def no_docker(*a, **k):
        raise AssertionError("Docker was asked before the dataset was read")

    monkeypatch.setattr("kvagent.sandbox.docker_backend.docker_client", no_docker)
    one_line_error(invoke(["grade", "gold", "--dataset", tmp_path / "none.jsonl"]), "none.jsonl")
    one_line_error(invoke(["grade", "gold", "--dataset", mini[0], "--instances", "no__such-1"]), "no__such-1")
    preds = tmp_path / "predictions"
    preds.mkdir()
    (preds / "full__persistent__dense__s0.jsonl").write_text("")
    one_line_error(invoke(["grade", preds, "--dataset", mini[0]]), "is a directory",
                   "full__persistent__dense__s0.jsonl")  # fmt: skip


def test_images_check_timeout_must_be_positive(mini):
    one_line_error(invoke(["images", "check", "--instances", "0:1", "--dataset", mini[0], "--timeout", "0"]),
                   "timeout: must be >= 1")  # fmt: skip


def test_images_build_takes_a_selection_without_a_dataset(monkeypatch):
    built = []
    monkeypatch.setattr(
        "kvagent.evals.images.build_images", lambda targets, **kw: built.append(targets) or []
    )
    assert invoke(["images", "build", "--instances", "re:flask"]).exit_code == 0
    assert built[-1] and all("flask" in t for t in built[-1])
    assert invoke(["images", "build", "--instances", "0:2"]).exit_code == 0 and len(built[-1]) == 2
    assert invoke(["images", "build", "--instances", "repo:pallets/flask"]).exit_code == 0
    assert built[-1] == built[0]
    one_line_error(invoke(["images", "build", "--instances", "re:zzz"]), "selects none", "known: ")


def test_images_base_takes_rebuild_like_build_and_check(monkeypatch):
    calls = []
    monkeypatch.setattr("kvagent.sandbox.images.build_base_image", lambda **kw: calls.append(kw) or "tag")
    assert invoke(["images", "base", "--rebuild"]).exit_code == 0 and calls[-1]["force"] is True
    assert invoke(["images", "base", "--force"]).exit_code == 0 and calls[-1]["force"] is True
    assert invoke(["images", "base"]).exit_code == 0 and calls[-1]["force"] is False


def test_report_of_something_that_is_not_a_run_directory(a_file, tmp_path):
    one_line_error(invoke(["report", a_file]), "is not a directory", "--out directory of a `kvagent eval`")
    one_line_error(invoke(["report", tmp_path / "nope"]), "is not a directory")
