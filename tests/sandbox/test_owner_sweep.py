"""Issue 16.3: SIGTERM closes sandboxes like Ctrl-C; every sandbox names its owner process, and the
sweep (before a process's first sandbox, and `kvagent clean`) removes those whose owner is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kvagent.sandbox import open_sandbox, owner, reaper

from .conftest import containers_with


def _child(script: str, tmp: Path) -> subprocess.Popen:
    """A python process that runs `script` with its temp dir at `tmp` and prints READY lines."""
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _commands_naming(root: str) -> list[int]:
    """Pids whose command line names `root` (bwrap's binds do), found without the marker."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(root.encode() in arg for arg in argv) and int(pid) != os.getpid():
            found.append(int(pid))
    return found


def _sandbox_dirs(tmp: Path) -> list[Path]:
    return sorted(p for p in tmp.iterdir() if p.name.startswith(owner.DIR_PREFIX))


HOLD_LOCAL = """
import sys
{install}
from kvagent.sandbox import open_sandbox
with open_sandbox("local", repo={repo!r}, isolation={isolation!r}) as sb:
    print("READY", sb.root, flush=True)
    sb.run("sleep 1000", timeout=900)
"""


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    d = tmp_path / "tmp"
    d.mkdir()
    return d


def test_owner_is_recorded_and_alive_while_the_sandbox_is_open(repo):
    with open_sandbox("local", repo=repo) as sb:
        rec = owner.owner_of_dir(os.path.basename(sb.root))
        assert rec is not None and rec.pid == os.getpid() and rec.alive()
        assert sb.root not in owner.sweep_dirs(os.path.dirname(sb.root))
        assert os.path.exists(sb.root)


def test_a_dead_or_reused_pid_is_not_an_owner():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    me = owner.Owner.me()
    assert not owner.Owner(proc.pid, me.start, me.host).alive()
    assert not owner.Owner(os.getpid(), str(int(me.start) + 1), me.host).alive()  # pid reused
    assert owner.Owner(os.getpid(), me.start, "another-host").alive()  # cannot tell: keep it


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
def test_sigterm_closes_the_sandbox_and_ends_its_command(repo, tmp, isolation):
    script = HOLD_LOCAL.format(
        install="from kvagent.cli.signals import install; install()", repo=str(repo), isolation=isolation
    )
    proc = _child(script, tmp)
    line = proc.stdout.readline().split()
    assert line and line[0] == "READY", proc.stderr.read()
    root = line[1]
    time.sleep(0.5)  # inside `sleep 1000`
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert not os.path.exists(root) and _sandbox_dirs(tmp) == []
    leftover = subprocess.run(["pgrep", "-f", "sleep 1000"], capture_output=True, text=True).stdout
    assert not any(_cwd_under(int(pid), root) for pid in leftover.split())


def _cwd_under(pid: int, root: str) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/cwd").startswith(root)
    except OSError:
        return False


def test_after_sigkill_the_next_process_sweeps_the_orphan(repo, tmp):
    proc = _child(HOLD_LOCAL.format(install="", repo=str(repo), isolation="bwrap"), tmp)
    line = proc.stdout.readline().split()
    assert line and line[0] == "READY", proc.stderr.read()
    proc.kill()
    proc.wait()
    orphan = Path(line[1])
    assert orphan.exists()  # SIGKILL skips every cleanup
    # A live process's sandbox in the same temp dir must survive the sweep.
    keeper = _child(HOLD_LOCAL.format(install="", repo=str(repo), isolation="bwrap"), tmp)
    try:
        kept = keeper.stdout.readline().split()
        assert kept and kept[0] == "READY", keeper.stderr.read()
        assert not orphan.exists()  # swept before the keeper's first sandbox
        # Killed right after READY, the owner often dies while bwrap starts, before bwrap's
        # --die-with-parent holds: then only the sweep ends the orphan's `sleep 1000`.
        assert _commands_naming(str(orphan)) == []
        assert Path(kept[1]).exists()
        assert owner.sweep_dirs(str(tmp)) == [] and Path(kept[1]).exists()
    finally:
        keeper.kill()
        keeper.wait()
    assert owner.sweep_dirs(str(tmp)) == [kept[1]]
    assert _sandbox_dirs(tmp) == [] and _commands_naming(kept[1]) == []


def test_the_sweep_ends_what_a_dead_owner_left_running_and_only_that(tmp):
    """A process carrying a dead owner's marker stands in for a command whose bwrap missed its
    owner's death (the race above, made certain); one of a live owner's sandbox (this process's,
    in the same temp dir) must survive."""
    # Sleeps, not reads stdin: under CI stdin is at EOF and the child would exit before its start
    # time is read (it did once: the dir was named "None" and counted as having no owner).
    dead = _child("import os, time; print('READY', os.getpid(), flush=True); time.sleep(600)", tmp)
    pid = int(dead.stdout.readline().split()[1])
    start = owner.process_start(pid)
    dead.kill()
    dead.wait()
    assert start, "the stand-in owner must be alive when its start time is read"
    orphan = tmp / f"{owner.DIR_PREFIX}{pid}-{start}-x"
    orphan.mkdir()
    me = owner.Owner.me()
    live = tmp / f"{owner.DIR_PREFIX}{me.pid}-{me.start}-y"
    live.mkdir()
    left = subprocess.Popen(["sleep", "60"], env={**os.environ, reaper.MARKER: str(orphan)})
    kept = subprocess.Popen(["sleep", "60"], env={**os.environ, reaper.MARKER: str(live)})
    try:
        assert owner.sweep_dirs(str(tmp)) == [str(orphan)]
        assert left.wait(timeout=10) == -signal.SIGKILL
        assert kept.poll() is None and kept.pid in reaper.marked(str(live)) and live.exists()
    finally:
        for proc in (left, kept):
            proc.kill()
            proc.wait()


def test_a_bwrap_command_carries_its_sandbox_marker(repo):
    with open_sandbox("local", repo=repo, isolation="bwrap") as sb:
        assert sb.run(f"echo ${reaper.MARKER}", timeout=30).output.strip() == sb.root


def test_ownerless_dirs_are_kept_unless_old(tmp):
    legacy = tmp / f"{owner.DIR_PREFIX}abc123"
    legacy.mkdir()
    assert owner.sweep_dirs(str(tmp)) == []
    assert owner.sweep_dirs(str(tmp), ownerless_after=3600) == []
    old = time.time() - 7200
    os.utime(legacy, (old, old))
    assert owner.sweep_dirs(str(tmp), ownerless_after=3600) == [str(legacy)]


def test_held_signals_delivers_a_sigterm_after_the_block():
    from kvagent.cli.signals import install

    before = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # install() leaves a handler someone else set
        install()
        with pytest.raises(KeyboardInterrupt), owner.held_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            done = True  # the block finishes before the interrupt
        assert done
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.slow
def test_sigkill_leaves_a_container_the_sweep_removes(base_image, repo, test_label, tmp):
    script = f"""
    from kvagent.sandbox import open_sandbox
    with open_sandbox("docker", image={base_image!r}, repo={str(repo)!r}, labels={test_label!r}) as sb:
        print("READY", flush=True)
        sb.run("sleep 1000", timeout=900)
    """
    proc = _child(script, tmp)
    assert proc.stdout.readline().strip() == "READY", proc.stderr.read()
    (cid,) = containers_with(test_label)
    proc.kill()
    proc.wait()
    assert containers_with(test_label) == [cid]
    from kvagent.sandbox.docker_backend import docker_client

    with open_sandbox("docker", image=base_image, repo=repo, labels=test_label) as live:
        owner.sweep_containers(docker_client())
        assert containers_with(test_label) == [live.container.id]  # the live owner's stays
    assert containers_with(test_label) == []
    assert _sandbox_dirs(tmp) == []  # the copy made for put_archive is gone too


@pytest.mark.slow
def test_sigterm_removes_the_container(base_image, repo, test_label, tmp):
    script = f"""
    from kvagent.cli.signals import install
    install()
    from kvagent.sandbox import open_sandbox
    with open_sandbox("docker", image={base_image!r}, repo={str(repo)!r}, labels={test_label!r}) as sb:
        print("READY", flush=True)
        sb.run("sleep 1000", timeout=900)
    """
    proc = _child(script, tmp)
    assert proc.stdout.readline().strip() == "READY", proc.stderr.read()
    assert len(containers_with(test_label)) == 1
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert containers_with(test_label) == []
