"""The container a call runs in, as R2E-Gym's (issue #57; docs/deepswe.md, "The container"): PID 1
is `/bin/bash -l` with a tty, a command run as R2E-Gym's runtime runs one (`run_command`) has its
own stdout and stderr and no kvagent process above it, `/` holds no /kvagent until kvagent's own
tools are used, and what such a command leaves running stays until the container is removed at
close, as in R2E-Gym's (its inner `timeout` makes its own process group). The same calls side by
side with R2E-Gym's own code: tests/sandbox/test_r2egym_real_container.py."""

from __future__ import annotations

import time

import pytest

from kvagent.sandbox import open_sandbox

from .conftest import containers_with

pytestmark = pytest.mark.slow

SAME_PIPE = 'sh -c \'[ "$(readlink /proc/$$/fd/1)" = "$(readlink /proc/$$/fd/2)" ] && echo one || echo two\''
# The calling shell's ancestors up to docker's exec (parent 0), then PID 1: what `ps -o args` shows
ANCESTORS = (
    'sh -c \'p=$$; while [ "$p" != 0 ]; do tr "\\0" " " < /proc/$p/cmdline; '
    'echo; p=$(cut -d" " -f4 /proc/$p/stat); done; tr "\\0" " " < /proc/1/cmdline; echo\''
)
SURVIVOR = (
    'sh -c \'for p in /proc/[0-9]*; do [ "$(tr "\\0" " " < $p/cmdline 2>/dev/null)" = "sleep 377 " ] '
    "&& echo alive; done; true'"
)


@pytest.fixture
def sb(base_image, repo, test_label):
    box = open_sandbox("docker", image=base_image, repo=repo, labels=test_label)
    yield box
    box.close()


def test_pid1_and_the_process_tree_are_r2egyms(sb):
    lines = sb.run_command(ANCESTORS, 90).output.splitlines()
    # kvagent's wrapper (`sh -c ... timeout -s KILL`) and docker-init are gone from the chain
    assert lines[-1] == "/bin/bash -l "
    assert lines[-2] == f"/bin/sh -c timeout 90 {ANCESTORS}  "  # R2E-Gym's trailing space, then argv's end
    assert not any("KILL" in line or "docker-init" in line or "sleep infinity" in line for line in lines)


def test_stdout_and_stderr_are_two_streams(sb):
    assert sb.run_command(SAME_PIPE, 90).output == "two\n"
    out = sb.run_command("sh -c 'echo out; echo err >&2'", 90).output
    assert sorted(out.splitlines()) == ["err", "out"]
    # kvagent's own commands keep one pipe (their interleaving is the order written)
    assert sb.run(SAME_PIPE, timeout=30).output == "one\n"


def test_root_shows_no_kvagent_until_its_tools_run(sb):
    assert "kvagent" not in sb.run_command("ls /", 90).output.split()
    sb.diff()  # kvagent's own scratch files come and go
    assert "kvagent" not in sb.run_command("ls /", 90).output.split()
    assert sb.run_tool("execute_bash", {"cmd": "echo hi"}).ok
    assert "kvagent" in sb.run_command("ls /", 90).output.split()


def test_a_background_child_outlives_the_call_but_not_the_container(base_image, repo, test_label):
    """R2E-Gym's fidelity: `(sleep 377 &)` outlives the call that started it (its `timeout 90` exits
    normally and kills nothing); close removes the container and every process in it."""
    with open_sandbox("docker", image=base_image, repo=repo, labels=test_label) as box:
        assert box.run_command("sh -c '(sleep 377 >/dev/null 2>&1 &)'", 90).exit_code == 0
        assert box.run_command(SURVIVOR, 90).output == "alive\n"
        # kvagent's own commands still take their children with them
        box.run("(sleep 378 >/dev/null 2>&1 &)", timeout=30)
        assert "sleep 378" not in box.run("cat /proc/[0-9]*/cmdline | tr '\\0' ' '", timeout=30).output
        assert containers_with(test_label)
    assert containers_with(test_label) == []


def test_pid1_reaps_orphans(sb):
    """Without docker-init, bash as PID 1 reaps what the calls leave to it (no zombies pile up)."""
    for _ in range(3):
        sb.run_command("sh -c '(sleep 0.2 >/dev/null 2>&1 &)'", 90)
    time.sleep(1.5)
    states = sb.run_command("sh -c 'cut -d\" \" -f3 /proc/[0-9]*/stat'", 90).output.split()
    assert states and "Z" not in states


def test_a_diff_leaves_an_images_own_kvagent_dir(sb):
    sb.run("mkdir -p /kvagent && touch /kvagent/keep", timeout=30)
    sb.diff()
    assert sb.run("ls /kvagent", timeout=30).output.split() == ["keep", "state"]
