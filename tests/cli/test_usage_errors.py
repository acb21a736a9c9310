"""What `kvagent` (the entry point, not the typer app) prints for usage errors typer itself finds:
one line naming the problem and where the help is, exit 2; help and success unchanged."""

from __future__ import annotations

import subprocess
import sys

import pytest


def kvagent(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvagent", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "args, words",
    [
        (["solve", "--polcy", "snapkv"], ["No such option: --polcy", "--policy", "`kvagent solve --help`"]),
        (["solve", "--issue", "x", "--max-steps", "many"], ["'--max-steps'", "integer"]),
        (["nosuch"], ["No such command 'nosuch'", "`kvagent --help`"]),
        (["bench", "fidelity", "--budgets"], ["'--budgets' requires an argument"]),
    ],
)
def test_a_usage_error_is_one_line(args, words):
    p = kvagent(*args)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvagent: error: "), p.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert "╭" not in p.stderr and "Traceback" not in p.stderr


def test_help_and_version_still_exit_zero():
    assert kvagent("--version").returncode == 0
    p = kvagent("report", "--help")
    assert p.returncode == 0 and "Usage" in p.stdout
    bare = kvagent()  # a bare group shows its help, with no empty error line after it
    assert (
        bare.returncode == 2 and "kvagent: error" not in bare.stderr and "Usage" in bare.stdout + bare.stderr
    )
