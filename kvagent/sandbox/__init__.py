"""kvagent.sandbox: isolated copies of a repository for agent episodes.

with open_sandbox(backend="local", repo="path/to/checkout") as sb:
    sb.run("pytest -x", timeout=90)          # Result(exit_code, output, timed_out)
    sb.run_tool("file_editor", {"command": "view", "path": sb.workdir})
    patch = sb.diff()
"""

from __future__ import annotations

from pathlib import Path

from kvagent.sandbox.base import TOOL_NAMES, Result, Sandbox
from kvagent.sandbox.errors import DockerUnavailableError, SandboxError
from kvagent.sandbox.images import DEFAULT_TAG, build_base_image, ensure_base_image

BACKENDS = ("local", "docker")

__all__ = [
    "BACKENDS",
    "DEFAULT_TAG",
    "TOOL_NAMES",
    "DockerUnavailableError",
    "Result",
    "Sandbox",
    "SandboxError",
    "build_base_image",
    "ensure_base_image",
    "open_sandbox",
]


def open_sandbox(
    backend: str = "local", *, repo: str | Path | None = None, image: str | None = None, **options
) -> Sandbox:
    """Open a sandbox. local: `repo`'s working tree is copied (isolation="bwrap" (= "auto"; refuses
    to open without a working bubblewrap) | "none" (unisolated, on purpose), network=False,
    bind=[host paths shown read-only], bind_rw=[... read-write]; docs/sandbox.md).
    docker: a container of `image` (network=False, mem_limit, pids_limit, setup="auto", repo=None,
    workdir="/testbed", labels, pull=False, client=a docker client to reuse)."""
    if backend == "local":
        if repo is None:
            raise SandboxError("the local backend needs repo=PATH (the checkout to copy)")
        if image is not None:
            raise SandboxError("image= is only for backend='docker'; drop it or switch backend")
        from kvagent.sandbox.local import LocalSandbox

        return LocalSandbox(repo, **options)
    if backend == "docker":
        if not image:
            raise SandboxError("the docker backend needs image=NAME (e.g. kvagent/base:bookworm)")
        from kvagent.sandbox.docker_backend import DockerSandbox

        return DockerSandbox(image, repo=repo, **options)
    raise SandboxError(f"unknown sandbox backend {backend!r}; use one of {', '.join(BACKENDS)}")
