"""Containers never outlive their sandbox: close, exceptions, Ctrl-C; clear errors for bad images."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from kvagent.sandbox import SandboxError, open_sandbox

from .conftest import containers_with

pytestmark = pytest.mark.slow


def test_removed_on_close(base_image, repo, test_label):
    sb = open_sandbox("docker", image=base_image, repo=repo, labels=test_label)
    assert len(containers_with(test_label)) == 1
    assert sb.workdir == "/testbed"
    sb.close()
    sb.close()  # idempotent
    assert containers_with(test_label) == []


def test_removed_after_exception_in_with(base_image, repo, test_label):
    with (
        pytest.raises(RuntimeError, match="boom"),
        open_sandbox("docker", image=base_image, repo=repo, labels=test_label),
    ):
        assert len(containers_with(test_label)) == 1
        raise RuntimeError("boom")
    assert containers_with(test_label) == []


def test_removed_after_sigint(base_image, repo, test_label):
    script = textwrap.dedent(
        f"""
        import sys
        from kvagent.sandbox import open_sandbox
        with open_sandbox("docker", image={base_image!r}, repo={str(repo)!r}, labels={test_label!r}) as sb:
            print("ready", flush=True)
            sb.run("sleep 1000", timeout=600)
        """
    )
    # A job a shell starts in the background (`cmd &`, no job control) inherits SIGINT ignored, and
    # Python then installs no KeyboardInterrupt handler: a suite run that way would wait out the
    # timeout. A Ctrl-C reaches a foreground process, whose SIGINT is the default; give it that.
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        assert len(containers_with(test_label)) == 1
        time.sleep(0.5)  # let it enter the long command
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert containers_with(test_label) == []


def test_removed_at_exit_without_close(base_image, repo, test_label):
    script = (
        "from kvagent.sandbox import open_sandbox\n"
        f"sb = open_sandbox('docker', image={base_image!r}, repo={str(repo)!r}, labels={test_label!r})\n"
        "print(sb.run('echo hi').output, end='')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout == "hi\n", out.stderr
    assert containers_with(test_label) == []


def test_limits_and_network_options(base_image, repo, test_label):
    from kvagent.sandbox.docker_backend import docker_client

    with open_sandbox(
        "docker", image=base_image, repo=repo, labels=test_label, mem_limit="512m", pids_limit=64
    ) as sb:
        attrs = docker_client().api.inspect_container(sb.container.id)["HostConfig"]
        assert attrs["NetworkMode"] == "none"
        assert attrs["Memory"] == 512 * 1024 * 1024 and attrs["PidsLimit"] == 64
        assert sb.run("git status --porcelain", timeout=30).output == ""


def test_setup_prefix_applies_to_commands(base_image, repo, test_label):
    with open_sandbox(
        "docker", image=base_image, repo=repo, labels=test_label, setup="export KV_SETUP=on"
    ) as sb:
        assert sb.run("echo $KV_SETUP", timeout=30).output == "on\n"
        r = sb.run_tool("execute_bash", {"cmd": "echo $KV_SETUP"})
        assert "[STDOUT]\n\non\n" in r.output


def test_unknown_image_is_a_clear_error(base_image, test_label):
    name = f"kvagent/does-not-exist:{uuid.uuid4().hex[:8]}"
    with pytest.raises(SandboxError, match="not found locally"):
        open_sandbox("docker", image=name, labels=test_label)
    assert containers_with(test_label) == []


def test_image_without_repo_dir_is_a_clear_error(base_image, test_label):
    with pytest.raises(SandboxError, match="has no /testbed"):
        open_sandbox("docker", image=base_image, labels=test_label)
    assert containers_with(test_label) == []


def test_unreachable_docker_is_a_clear_error(monkeypatch):
    from kvagent.sandbox.docker_backend import docker_client
    from kvagent.sandbox.errors import DockerUnavailableError

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(DockerUnavailableError, match="cannot reach the Docker daemon"):
        docker_client()
    assert os.environ["DOCKER_HOST"].startswith("unix:")
