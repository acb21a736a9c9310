"""Unisolated local sandboxes (isolation="none") have no PID namespace: a command that leaves its
process group (setsid, a double fork) is still found by its sandbox marker and killed."""

from __future__ import annotations

import os
import time

import pytest

from kvagent.sandbox import open_sandbox
from kvagent.sandbox.reaper import MARKER, marked


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"  # a zombie is dead, just not yet reaped
    except OSError:
        return False


def _pids_running(sb, tag: str) -> list[int]:
    """Our sandbox's processes whose command line holds `tag`."""
    out = []
    for pid in marked(sb.root):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if tag.encode() in f.read() and _alive(pid):
                    out.append(pid)
        except OSError:
            pass
    return out


@pytest.mark.parametrize(
    "command",
    [
        # Each waits until the escape has happened, so only the reaper can end it.
        "setsid sleep 301 >/dev/null 2>&1 < /dev/null & sleep 0.5; echo started",  # own session
        "(setsid sh -c 'sleep 301 & exit' >/dev/null 2>&1 &) ; sleep 0.5; echo started",  # orphaned
    ],
    ids=["setsid", "double-fork"],
)
def test_processes_that_left_the_group_end_with_the_command(repo, command):
    with open_sandbox("local", repo=repo, isolation="none") as sb:
        r = sb.run(command, timeout=30)
        assert r.output == "started\n", r.output
        deadline = time.monotonic() + 5
        while _pids_running(sb, "sleep") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _pids_running(sb, "sleep") == []


def test_the_marker_finds_what_a_command_left_running_and_only_that(repo):
    """Without the reaper the setsid'd sleep would survive: the scan is what finds it."""
    with open_sandbox("local", repo=repo, isolation="none") as a, open_sandbox("local", repo=repo,
                                                                              isolation="none") as b:  # fmt: skip
        assert a.run(f"echo ${MARKER}", timeout=30).output.strip() == a.root
        # Keep one process of b alive across a's command: a's reaper must not touch it.
        import subprocess

        keep = subprocess.Popen(["sleep", "30"], env={**os.environ, MARKER: b.root})
        try:
            a.run("setsid sleep 302 >/dev/null 2>&1 < /dev/null &", timeout=30)
            assert keep.poll() is None and keep.pid in marked(b.root)
        finally:
            keep.kill()
            keep.wait()
