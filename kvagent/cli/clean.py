"""`kvagent clean`: remove sandbox temp dirs and containers left by kvagent processes that are gone
(killed with SIGKILL, out of memory, a machine reset). Every sandbox names its owner process, so a
sandbox of a run still going is never touched; the same sweep runs before each process's first
sandbox, so this command is for reclaiming space by hand."""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from rich.console import Console

# Sandboxes made before owners were recorded have none; past this age they count as orphans.
OWNERLESS_AFTER_S = 3600.0
# How long the startup sweep may hold up the exit of a command that finished before it did.
STARTUP_SWEEP_JOIN_S = 15.0


def startup_sweep() -> threading.Thread:
    """Sweep orphans of killed kvagent processes in the background, so no command waits for it
    (sandbox.owner.sweep_once: a first sandbox opened meanwhile waits for nothing either)."""

    def work() -> None:
        from kvagent.sandbox import owner

        owner.sweep_once("dirs")
        client = _local_docker()
        if client is not None:
            owner.sweep_once("containers", client)

    thread = threading.Thread(target=work, name="kvagent-sweep", daemon=True)
    thread.start()
    atexit.register(thread.join, STARTUP_SWEEP_JOIN_S)
    return thread


def _local_docker() -> Any:
    """A client when a Docker daemon answers quickly; None otherwise (the sweep is best effort)."""
    if not os.environ.get("DOCKER_HOST") and not os.path.exists("/var/run/docker.sock"):
        return None
    try:
        import docker

        client = docker.from_env(timeout=10)
        client.ping()
        return client
    except Exception:
        return None


def run_clean(*, docker: bool = True, console: Console | None = None) -> dict[str, list[str]]:
    from kvagent.sandbox import owner
    from kvagent.sandbox.docker_backend import docker_client
    from kvagent.sandbox.errors import DockerUnavailableError

    console = console or Console(stderr=True)
    dirs = owner.sweep_dirs(ownerless_after=OWNERLESS_AFTER_S)
    containers: list[str] = []
    if docker:
        client: Any = None
        try:
            client = docker_client()
        except DockerUnavailableError as e:
            console.print(f"containers: not checked ({e}); pass --no-docker to skip them", soft_wrap=True)
        if client is not None:
            containers = owner.sweep_containers(client, ownerless_after=OWNERLESS_AFTER_S)
    for path in dirs:
        console.print(f"removed {path}", soft_wrap=True, markup=False)  # whole paths, to copy
    for name in containers:
        console.print(f"removed container {name}", soft_wrap=True, markup=False)
    console.print(
        f"{len(dirs)} sandbox dir(s) and {len(containers)} container(s) of finished kvagent processes removed"
    )
    return {"dirs": dirs, "containers": containers}
