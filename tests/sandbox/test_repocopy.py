"""Issue 16.7: the sandbox copy of a checkout holds what the user sees (uncommitted edits,
deletions, staged and untracked files, not ignored ones), says so in one line, and leaves the
checkout untouched; the agent's patch holds only the agent's changes."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from kvagent.sandbox import open_sandbox

from .conftest import BACKENDS, open_backend


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def dirty(repo: Path) -> Path:
    (repo / ".gitignore").write_text("build/\n*.log\n")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".gitignore")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "ignore")
    (repo / "a.py").write_text("def add(a, b):\n    return a + b + 0  # edited\n")  # modified
    (repo / "README.md").unlink()  # deleted
    (repo / "staged.py").write_text("STAGED = 1\n")
    _git(repo, "add", "staged.py")  # staged, new
    (repo / "notes" / "todo.txt").parent.mkdir()
    (repo / "notes" / "todo.txt").write_text("untracked\n")  # untracked
    (repo / "build").mkdir()
    (repo / "build" / "out.bin").write_text("ignored\n")  # ignored
    (repo / "run.log").write_text("ignored\n")
    return repo


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_copy_holds_the_working_tree(dirty, request, backend, caplog):
    status_before = _git(dirty, "status", "--porcelain")
    with caplog.at_level(logging.WARNING), open_backend(backend, dirty, request) as sb:
        assert "edited" in sb.read("a.py")
        assert sb.read("staged.py") == "STAGED = 1\n"
        assert sb.read("notes/todo.txt") == "untracked\n"
        r = sb.run("test -e README.md; echo readme=$?; ls build run.log 2>&1 | head -2", timeout=30)
        assert (
            "readme=1" in r.output and "No such file" in r.output
        )  # deleted stays deleted; ignored left out
        assert sb.diff() == ""  # the user's changes are the base, not part of the agent's patch
        sb.write("new.py", "X = 1\n")
        patch = sb.diff()
        assert "new.py" in patch and "edited" not in patch and "todo" not in patch
        assert "1 untracked" in sb.copy_note and "3 changed" in sb.copy_note  # a.py, README.md, staged.py
    notes = [r.getMessage() for r in caplog.records if "uncommitted changes" in r.getMessage()]
    assert len(notes) == 1 and "\n" not in notes[0]
    assert _git(dirty, "status", "--porcelain") == status_before  # the checkout is untouched


def test_a_clean_checkout_says_nothing(repo, caplog):
    with caplog.at_level(logging.WARNING), open_sandbox("local", repo=repo) as sb:
        assert sb.copy_note == ""
        assert sb.run("git status --porcelain", timeout=30).output == ""
    assert not [r for r in caplog.records if "uncommitted" in r.getMessage()]
