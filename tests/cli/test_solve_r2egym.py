"""`kvagent solve --prompts FILE --scaffold r2egym` on tiny-random-qwen3 (a real session): the
trajectory's system message is the file's system_prompt byte for byte, its first user message the
instance_prompt filled in (plus R2E-Gym's countdown line), and the profile is recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvagent.testing import git_repo

KVAGENT = str(Path(sys.executable).with_name("kvagent"))
SYSTEM = (
    "You are a programming agent.\n\n–– BEGIN FUNCTION #1: execute_bash ––\n  •\tRun a command.\n"
    "–– END FUNCTION #1 ––\n\n<IMPORTANT>\n- Only call one function at a time"
)
INSTANCE = "I have uploaded a repository in /testbed.\n\n<github_issue>\n{problem_statement}\n</github_issue>\n\nFix it."


def test_solve_with_prompt_file_and_r2egym_profile(tmp_path):
    repo = tmp_path / "repo"
    git_repo(repo, {"calc.py": "def add(a, b):\n    return a - b\n"})
    prompts = tmp_path / "edit_non_fn_calling.yaml"
    prompts.write_text(
        yaml.safe_dump({"system_prompt": SYSTEM, "instance_prompt": INSTANCE}, allow_unicode=True)
    )
    out = tmp_path / "out"
    args = [
        "solve", "--repo", str(repo), "--issue", "add() subtracts", "--model", "tiny-random-qwen3",
        "--device", "cpu", "--prompts", str(prompts), "--scaffold", "r2egym", "--history", "drop-thinking",
        "--max-steps", "2", "--context-limit", "160", "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run([KVAGENT, *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    traj = json.loads((out / "episode.traj.json").read_text(encoding="utf-8"))
    system, user = traj["messages"][0], traj["messages"][1]
    assert system["role"] == "system" and system["content"].encode() == SYSTEM.encode()
    filled = INSTANCE.format(problem_statement="add() subtracts")
    assert user["role"] == "user" and user["content"] == filled + "\nSteps Remaining: 40"
    cfg = traj["config"]
    assert (cfg["scaffold"], cfg["history"], cfg["prompts"]) == ("r2egym", "drop-thinking", str(prompts))
    assert cfg["max_new_tokens"] is None and cfg["soft_step_limit"] == 40
    assert traj["exit_status"] in ("context_limit", "step_limit", "submitted")


def test_bad_prompt_file_is_one_line_error(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("system_prompt: x\ninstance_prompt: no placeholder\n")
    proc = subprocess.run(
        [
            KVAGENT,
            "solve",
            "--repo",
            str(tmp_path),
            "--issue",
            "x",
            "--prompts",
            str(bad),
            "--scaffold",
            "r2egym",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("kvagent: error: prompts ")


def test_solve_with_an_r2egym_checkout_is_r2egyms_whole_protocol(tmp_path):
    """`--r2egym PATH --scaffold r2egym`: the prompts and countdown from the (fake) checkout, R2E-Gym's
    history and patch rule by default, the sampling flags and their record."""
    from tests.agent.test_r2egym_source import STRINGS, make_checkout

    repo = tmp_path / "repo"
    git_repo(repo, {"calc.py": "def add(a, b):\n    return a - b\n"})
    checkout = make_checkout(tmp_path / "R2E-Gym")
    out = tmp_path / "out"
    args = [
        "solve", "--repo", str(repo), "--issue", "add() subtracts", "--model", "tiny-random-qwen3",
        "--device", "cpu", "--r2egym", str(checkout), "--scaffold", "r2egym", "--top-k", "7",
        "--max-steps", "2", "--context-limit", "200", "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run([KVAGENT, *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    traj = json.loads((out / "episode.traj.json").read_text(encoding="utf-8"))
    assert traj["messages"][0]["content"] == STRINGS["SYSTEM"]
    user = traj["messages"][1]["content"]  # {working_dir}: the sandbox's copy here, /testbed in images
    assert user.startswith("Issue, in ") and user.endswith(
        ":\nadd() subtracts\nDo it.\nMoves left: 40 (of many)"
    )
    cfg = traj["config"]
    assert (cfg["r2egym_path"], cfg["history"], cfg["patch_rule"]) == (str(checkout), "r2egym", "r2egym")
    assert (cfg["top_k"], cfg["top_p"], cfg["max_new_tokens"], cfg["stop"]) == (7, None, None, [])
    assert traj["graded_patch"] == "r2egym" and set(traj["patches"]) == {"full", "r2egym"}


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--r2egym", "{tmp}", "--scaffold", "r2egym"], "is not an R2E-Gym checkout"),
        (["--r2egym", "{checkout}"], "add --scaffold r2egym"),
        (["--history", "r2egym"], "use it with --scaffold r2egym"),
        (["--patch-rule", "some"], "patch-rule: got 'some'"),
        (["--network", "default"], "network: --network default is for docker sandboxes"),
        (["--network", "host"], "network: got 'host'"),
    ],
    ids=[
        "not-a-checkout",
        "checkout-without-scaffold",
        "history-needs-scaffold",
        "patch-rule",
        "network-local",
        "network-bad",
    ],
)
def test_protocol_options_fail_with_one_line(tmp_path, extra, needle):
    from tests.agent.test_r2egym_source import make_checkout

    checkout = make_checkout(tmp_path / "R2E-Gym")
    extra = [a.format(tmp=tmp_path, checkout=checkout) for a in extra]
    proc = subprocess.run(
        [KVAGENT, "solve", "--repo", str(tmp_path), "--issue", "x", *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("kvagent: error: ") and needle in last, last


def test_network_reaches_the_docker_sandbox_spec():
    from kvagent.cli.environments import with_network

    assert with_network({"backend": "docker", "image": "i"}, "default") == {
        "backend": "docker",
        "image": "i",
        "network": True,
    }
    assert with_network({"backend": "docker", "image": "i"}, "none") == {"backend": "docker", "image": "i"}
