"""`kvagent solve` stopped by SIGTERM (kill, schedulers, CI) cleans up like Ctrl-C: the sandbox and
its command are gone, the partial trajectory is kept, exit 130 (issue 16.3). The seeded soak over
solve and eval, SIGTERM and SIGKILL, is scripts/kill_soak.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvagent.testing import git_repo

KVAGENT = str(Path(sys.executable).with_name("kvagent"))
TINY = ["--model", "tiny-random-qwen3", "--device", "cpu", "--max-new-tokens", "8"]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    git_repo(root, {"calc.py": "def mean(v):\n    return sum(v) / (len(v) + 1)\n"})
    return root


def _wait_for(pred, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return False


def test_sigterm_during_solve_leaves_no_sandbox(repo, tmp_path):
    tmp = tmp_path / "tmp"  # the child's TMPDIR: its sandbox dir appears here and nowhere else
    tmp.mkdir()
    out = tmp_path / "run"
    env = {**os.environ, "TMPDIR": str(tmp), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    argv = [KVAGENT, "solve", "--issue", "mean is off by one", "--repo", str(repo), *TINY,
            "--max-steps", "200", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        sandboxes = lambda: [p for p in tmp.iterdir() if p.name.startswith("kvagent-sbx-")]  # noqa: E731
        assert _wait_for(sandboxes, 240), "the sandbox never opened"
        time.sleep(3)  # into the episode: generating or running a command
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert sandboxes() == []
    assert "interrupted" in err and "Traceback" not in err
