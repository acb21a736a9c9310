"""Side by side in Docker, against a real R2E-Gym checkout (`KVAGENT_R2EGYM_CHECKOUT`; skipped without
one or without Docker): one container started by R2E-Gym's own `DockerRuntime.start_container` and
driven by its `DockerRuntime.run`, both loaded from the checkout, and a kvagent docker sandbox of the
same image driven by `run_command` (the `--r2egym` path), give the same (output, code) for calls
that print to both streams, ask whether stdout and stderr share a pipe, list `/`, show PID 1 and the
calling shell's ancestors (what `ps` shows of them, read from /proc: the base image has no procps),
and background processes (one that outlives its call, one that holds the output)."""

from __future__ import annotations

import io
import tarfile
import types
import uuid
from pathlib import Path

import pytest

from kvagent.agent.r2egym import runtime_output
from kvagent.sandbox import open_sandbox

from .conftest import make_repo
from .test_r2egym_container import ANCESTORS, SAME_PIPE, SURVIVOR
from .test_r2egym_real_checkout import CHECKOUT, class_functions, r2egym_code

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHECKOUT, reason="set KVAGENT_R2EGYM_CHECKOUT to an R2E-Gym checkout"),
]

BOTH = "sh -c 'echo out; echo err >&2; echo out2; echo err2 >&2'"
CALLS = [
    (BOTH, "lines"),  # the two streams' interleaving depends on timing in both: compared as line sets
    (SAME_PIPE, "exact"),
    ("ls /", "exact"),
    (ANCESTORS, "exact"),
    ("sh -c 'ps -o args= -p 1 2>&1; true'", "exact"),  # procps itself, where the image has it
    ("sh -c '(sleep 377 >/dev/null 2>&1 &)'", "exact"),
    (SURVIVOR, "exact"),
    ("sh -c 'sleep 1 & echo started'", "exact"),
    ("sh -c 'env | grep -v ^HOSTNAME= | sort'", "exact"),
    ("sh -c 'echo gone >&2; exit 3'", "exact"),
]


def tar_of(root: Path, arcname: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(root), arcname=arcname)
    return buf.getvalue()


def test_the_container_is_r2egyms(base_image, tmp_path, test_label):
    import docker

    root = Path(CHECKOUT).expanduser()
    _, _, run = r2egym_code(root)
    start = class_functions(
        root / "src/r2egym/agenthub/runtime/docker.py", "DockerRuntime", ("start_container",), {}
    )
    client = docker.from_env()
    theirs = types.SimpleNamespace(backend="docker", client=client, container=None, repo_path="/testbed")
    theirs.logger = types.SimpleNamespace(error=lambda *a: None, info=lambda *a: None)
    theirs.stop_container = lambda: None
    repo = make_repo(tmp_path / "repo", {"a.py": "x = 1\n"})
    name = f"r2egym-side-{uuid.uuid4().hex[:8]}"
    start["start_container"](theirs, base_image, ["/bin/bash", "-l"], name, labels=test_label)
    try:
        assert theirs.container is not None
        theirs.container.put_archive("/", tar_of(repo, "testbed"))
        with open_sandbox("docker", image=base_image, repo=repo, labels=test_label, network=True) as sb:
            for line, how in CALLS:
                want = run(theirs, line, timeout=90)
                got = runtime_output(sb.run_command(line, 90), 90)
                if how == "lines":
                    want, got = (sorted(want[0].splitlines()), want[1]), (sorted(got[0].splitlines()), got[1])
                assert got == want, line
    finally:
        client.api.remove_container(name, force=True)
