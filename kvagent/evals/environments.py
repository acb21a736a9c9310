"""Where eval episodes run and are graded: per-instance sandbox openers and graders."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvagent.errors import KvagentError
from kvagent.evals.datasets import Instance


def docker_env(instance: Instance) -> Any:
    """The instance's image (a locally built kvagent image, else the official one)."""
    from kvagent.evals.images import image_for
    from kvagent.sandbox import open_sandbox

    return open_sandbox("docker", image=image_for(instance))


def docker_grader(instance: Instance, patch: str, log_dir: Path) -> dict[str, Any]:
    from kvagent.evals.grading import grade_instance

    return grade_instance(instance, patch, log_dir=log_dir)


def local_repo(repos: Path, instance: Instance) -> Path:
    """`repos/<instance_id>`: a checkout at the instance's base commit."""
    path = Path(repos) / instance.instance_id
    if not path.is_dir():
        raise KvagentError(
            f"no checkout for {instance.instance_id} at {path}; clone it there at {instance.base_commit[:12]}"
        )
    return path


def local_env(repos: Path) -> Callable[[Instance], Any]:
    from kvagent.sandbox import open_sandbox

    return lambda instance: open_sandbox("local", repo=local_repo(repos, instance))


def local_grader(repos: Path) -> Callable[[Instance, str, Path], dict[str, Any]]:
    from kvagent.evals.grading import grade_in_sandbox
    from kvagent.sandbox import open_sandbox

    def grade(instance: Instance, patch: str, log_dir: Path) -> dict[str, Any]:
        with open_sandbox("local", repo=local_repo(repos, instance)) as sandbox:
            return grade_in_sandbox(instance, patch, sandbox, log_dir=log_dir)

    return grade
