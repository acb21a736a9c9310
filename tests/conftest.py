"""Shared fixtures: the Qwen3 tokenizer, a scripted model session (`kvagent.testing`), and a small
environment that runs the file editor / bash / search tools on a temp-dir git repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


def pytest_configure(config):
    # Small models on a 2-core machine: more threads than cores only adds contention.
    import torch

    torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    from kvagent.runtime.models import load_qwen3_tokenizer

    return load_qwen3_tokenizer()


@pytest.fixture(scope="session")
def tokenizer(qwen3_tokenizer):
    return qwen3_tokenizer


@pytest.fixture
def scripted(tokenizer):
    from kvagent.testing import ScriptedSession

    def make(replies: list[str], **kw: Any) -> ScriptedSession:
        return ScriptedSession(tokenizer, replies, **kw)

    return make


@dataclass
class Result:
    exit_code: int
    output: str
    timed_out: bool = False


@dataclass
class FakeEnv:
    """A git checkout in a temp dir shown to the model as /testbed; tools run as local subprocesses."""

    root: Path
    workdir: str = "/testbed"
    calls: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    fail_on: str | None = None  # tool name whose call raises, to test the error path

    def _path(self, p: str) -> Path:
        return self.root / p.removeprefix(self.workdir).lstrip("/")

    def run_tool(self, name: str, params: dict[str, str], timeout: float = 90) -> Result:
        self.calls.append((name, dict(params)))
        if name == self.fail_on:
            raise RuntimeError("sandbox container died")
        if name == "execute_bash":
            return self._bash(params["cmd"], timeout)
        if name == "file_editor":
            return self._edit(params)
        if name == "search":
            out = subprocess.run(
                ["grep", "-rn", params["search_term"], str(self._path(params["path"]))],
                capture_output=True,
                text=True,
            )
            return Result(0, out.stdout.replace(str(self.root), self.workdir))
        if name == "finish":
            return Result(0, "")
        return Result(1, f"unknown tool {name}")

    def _bash(self, cmd: str, timeout: float) -> Result:
        env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        try:
            p = subprocess.run(
                ["bash", "-c", cmd.replace(self.workdir, str(self.root))],
                capture_output=True, text=True, timeout=timeout, env=env, cwd=self.root,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return Result(-1, "Exit code: -1\nExecution output of [execute_bash]:\n", timed_out=True)
        out = f"[STDOUT]\n\n{p.stdout}\n\n[STDERR]\n\n{p.stderr}".replace(str(self.root), self.workdir)
        return Result(p.returncode, f"Exit code: {p.returncode}\nExecution output of [execute_bash]:\n{out}")

    def _edit(self, params: dict[str, str]) -> Result:
        path, command = self._path(params["path"]), params["command"]
        if command == "view":
            if path.is_dir():
                return Result(0, "\n".join(sorted(str(p.relative_to(self.root)) for p in path.rglob("*.py"))))
            lines = path.read_text().split("\n")
            return Result(0, "\n".join(f"{i:6d}\t{line}" for i, line in enumerate(lines, 1)))
        if command == "create":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(params["file_text"] + "\n")
            return Result(0, f"File created at {params['path']}")
        if command == "str_replace":
            text, old = path.read_text(), params["old_str"]
            if text.count(old) != 1:
                return Result(1, f"ERROR: old_str occurs {text.count(old)} times in {params['path']}")
            path.write_text(text.replace(old, params.get("new_str", "")))
            return Result(0, f"The file {params['path']} has been edited.")
        return Result(1, f"ERROR: command {command} is not supported by this test environment")

    def diff(self) -> str:
        git = ["git", "-C", str(self.root)]
        subprocess.run([*git, "add", "-A"], check=True, capture_output=True)
        return subprocess.run(
            [*git, "diff", "--cached", "HEAD"], check=True, capture_output=True, text=True
        ).stdout


BUGGY_SOURCE = '''"""Tiny statistics helpers."""


def mean(values):
    """Arithmetic mean of a non-empty sequence."""
    total = sum(values)
    return total / (len(values) + 1)
'''

TEST_SOURCE = """from calc import mean


def test_mean():
    assert mean([1, 2, 3]) == 2
"""


def make_repo(root: Path) -> Path:
    from kvagent.testing import git_repo

    files = {
        "calc/__init__.py": BUGGY_SOURCE,
        "tests/test_calc.py": TEST_SOURCE,
        ".gitignore": "__pycache__/\n.pytest_cache/\n",
    }
    git_repo(root, files)
    return root


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    return make_repo(tmp_path / "repo")


@pytest.fixture
def fake_env(repo: Path) -> FakeEnv:
    return FakeEnv(repo)


@pytest.fixture
def fresh_repo(tmp_path: Path):
    """A second, untouched copy of the fixture repository (to check that a patch applies and fixes it)."""
    return lambda: make_repo(tmp_path / "fresh")


@pytest.fixture(scope="session")
def base_image() -> str:
    """The sandbox base image, built on first use; a skip when Docker is unreachable (CI: a failure)."""
    from kvagent.sandbox import ensure_base_image
    from tests.helpers import require_docker

    require_docker()
    return ensure_base_image()


# ----------------------------------------------------------------------------- replay episodes
def _obs(i: int) -> str:
    lines = [f"    {n}\tdef helper_{i}_{n}(x):  return x * {n} + {i}" for n in range(1, 9)]
    return (
        f"Execution output of [file_editor]:\nHere's the result of running `cat -n` on /testbed/m{i}.py:\n"
        + "\n".join(lines)
    )


def record(rid: str = "fixture-1", turns: int = 6) -> dict:
    """A small normalised-JSONL record: function calls in `tool_calls`, observations as `tool`."""
    msgs = [
        {"role": "system", "content": "You are a coding agent. Call one tool per reply."},
        {"role": "user", "content": "Fix the off-by-one error in m3.py."},
    ]
    for i in range(turns):
        call = {"name": "file_editor", "arguments": json.dumps({"command": "view", "path": f"m{i}.py"})}
        if i % 2:  # the OpenAI shape appears in real records too
            call = {"id": f"c{i}", "type": "function", "function": call}
        msgs.append({"role": "assistant", "content": f"Let me look at m{i}.py.", "tool_calls": [call]})
        msgs.append({"role": "tool", "content": _obs(i)})
    msgs.append(
        {
            "role": "assistant",
            "content": "Done.",
            "tool_calls": [{"name": "finish", "arguments": '{"command": "submit"}'}],
        }
    )
    return {"id": rid, "scaffold": "test", "messages": msgs}


@pytest.fixture(scope="session")
def episode_record():
    return record


@pytest.fixture
def jsonl_file(tmp_path):
    path = tmp_path / "traj.jsonl"
    path.write_text("\n".join(json.dumps(record(f"fixture-{k}")) for k in (1, 2)) + "\n", encoding="utf-8")
    return path
