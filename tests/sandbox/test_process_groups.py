"""Issue 16.9: in both backends a command's background processes end when it returns or times
out, and read/write reach only the working tree (and the sandbox's state dir)."""

from __future__ import annotations

import time

import pytest

from kvagent.sandbox import SandboxError, open_sandbox

from .conftest import open_backend

# local under bwrap, local unisolated, docker: all three must behave the same
VARIANTS = [
    pytest.param(("local", "bwrap"), id="local-bwrap"),
    pytest.param(("local", "none"), id="local-none"),
    pytest.param(("docker", None), id="docker", marks=pytest.mark.slow),
]


@pytest.fixture(params=VARIANTS)
def sb(request, repo):
    backend, isolation = request.param
    kw = {"isolation": isolation} if isolation else {}
    box = open_backend(backend, repo, request, **kw)
    yield box
    box.close()


def test_background_processes_end_when_the_command_returns(sb):
    # Detached from the output pipe, so only killing its process group can stop it.
    r = sb.run("nohup sh -c 'sleep 2; touch escaped' >/dev/null 2>&1 & echo started", timeout=30)
    assert r.output == "started\n" and r.exit_code == 0
    time.sleep(3.5)
    assert sb.run("test -e escaped", timeout=30).exit_code == 1


def test_background_processes_end_when_the_command_times_out(sb):
    r = sb.run("nohup sh -c 'sleep 2; touch escaped' >/dev/null 2>&1 & sleep 30", timeout=1)
    assert r.timed_out
    time.sleep(3.5)
    assert sb.run("test -e escaped", timeout=30).exit_code == 1


def test_a_background_process_holding_the_output_does_not_delay_the_return(sb):
    start = time.monotonic()
    r = sb.run("sleep 60 & echo held", timeout=30)
    assert r.output == "held\n" and time.monotonic() - start < 4


def test_read_and_write_are_confined_to_the_working_tree(sb):
    for path in ("/etc/passwd", "../outside.txt", "/tmp/x", f"{sb.workdir}/../x"):
        with pytest.raises(SandboxError, match="outside the sandbox"):
            sb.read(path)
        with pytest.raises(SandboxError, match="outside the sandbox"):
            sb.write(path, "x")
    assert sb.run("ln -s /etc etc-link && ln -s /etc/hostname host-link", timeout=30).exit_code == 0
    for path in ("etc-link/passwd", "host-link"):  # a symlink does not lead out either
        with pytest.raises(SandboxError, match="outside the sandbox"):
            sb.read(path)
    with pytest.raises(SandboxError, match="outside the sandbox"):
        sb.write("etc-link/kvagent-probe", "x")
    sb.write("sub/dir/new.txt", "inside\n")  # inside: fine, parents made
    assert sb.read(f"{sb.workdir}/sub/dir/new.txt") == "inside\n"
    assert "sub/dir/new.txt" in sb.diff()  # diff() goes through the state dir


def test_unisolated_runs_only_when_asked(repo):
    with open_sandbox("local", repo=repo, isolation="none") as box:
        assert box.bwrap is None and box.isolation == "none"
    with open_sandbox("local", repo=repo) as box:
        assert box.bwrap is not None and box.isolation == "bwrap"
