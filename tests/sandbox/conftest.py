"""Shared fixtures: a small git repository and sandboxes per backend (the base image, and the skip when
Docker is unreachable, come from tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from kvagent.sandbox import open_sandbox

BACKENDS = ["local", pytest.param("docker", marks=pytest.mark.slow)]

A_PY = """def add(a, b):
    return a + b


def sub(a, b):
    value = a - b
    return value


TOTAL = add(1, 2)
"""

FILES = {
    "a.py": A_PY,
    "README.md": "hello\nworld\nhello again\n",
    "pkg/__init__.py": "",
    "pkg/mod.py": "import os\n\nNAME = 'mod'\n\n\ndef helper():\n    return NAME\n",
    "pkg/deep/inner/leaf.py": "LEAF = 1\n",
    "long.py": "def big(x):\n    a = x\n    b = a + 1\n    c = b * 2\n    return c\n\n\nclass K:\n    pass\n",
    "docs/guide.txt": "Guide\n\tTabbed line\n",
    ".hidden/secret.txt": "hello hidden\n",
}


def make_repo(root: Path, files: dict[str, str] = FILES, git: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    if git:
        env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
        for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "base"]):
            subprocess.run(cmd, cwd=root, check=True, env=env)
    return root


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


@pytest.fixture
def test_label() -> dict[str, str]:
    return {"kvagent.test": uuid.uuid4().hex}


def open_backend(backend: str, repo: Path, request: pytest.FixtureRequest, **kw):
    if backend == "docker":
        image = request.getfixturevalue("base_image")
        labels = request.getfixturevalue("test_label")
        return open_sandbox("docker", image=image, repo=repo, labels=labels, **kw)
    return open_sandbox("local", repo=repo, **kw)


@pytest.fixture(params=BACKENDS)
def sandbox(request, repo):
    sb = open_backend(request.param, repo, request)
    yield sb
    sb.close()


def containers_with(label: dict[str, str]) -> list[str]:
    import docker

    ((key, value),) = label.items()
    client = docker.from_env()
    return [c.id for c in client.containers.list(all=True, filters={"label": [f"{key}={value}"]})]
