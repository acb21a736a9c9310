"""`kvagent solve --prompts FILE --scaffold r2egym` on tiny-random-qwen3 (a real session): the
trajectory's system message is the file's system_prompt byte for byte, its first user message the
instance_prompt filled in (plus R2E-Gym's countdown line), and the profile is recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
