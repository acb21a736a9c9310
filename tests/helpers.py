"""Small pieces several test modules share: model replies in the Qwen3 function-call format and the
Docker check. (Fixture repositories and instances for non-test code too live in kvagent.testing.)"""

from __future__ import annotations

import os

import pytest


def call(name: str, **params: str) -> str:
    """One function call as the model writes it: `<function=name>`, a line per parameter."""
    body = "".join(f"<parameter={k}>{v}</parameter>\n" for k, v in params.items())
    return f"<function={name}>\n{body}</function>"


SUBMIT = "Done.\n" + call("finish", command="submit", result="ok")

# The fix of the bug in tests/conftest.py's repository (mean() divides by len + 1).
FIX_MEAN = call(
    "file_editor",
    command="str_replace",
    path="/testbed/calc/__init__.py",
    old_str="return total / (len(values) + 1)",
    new_str="return total / len(values)",
)


def require_docker():
    """A connected Docker client; else the test is skipped, except under CI=true, where Docker is
    part of the contract and its absence a failure."""
    from kvagent.sandbox.docker_backend import docker_client
    from kvagent.sandbox.errors import DockerUnavailableError

    try:
        return docker_client()
    except DockerUnavailableError as e:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but Docker is unreachable: {e}")
        pytest.skip(f"Docker is unreachable ({e}); start dockerd to run the Docker tests")
