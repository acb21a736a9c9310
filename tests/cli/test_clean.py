"""`kvagent clean` and the startup sweep: sandboxes of kvagent processes that are gone are removed,
those of running ones are kept (issue 16.3)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kvagent.sandbox import owner

KVAGENT = str(Path(sys.executable).with_name("kvagent"))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _kvagent(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp), "NO_COLOR": "1"}
    return subprocess.run([KVAGENT, *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    d = tmp_path / "tmp"
    d.mkdir()
    return d


def _planted(tmp: Path) -> tuple[Path, Path]:
    me = owner.Owner.me()
    orphan = tmp / f"{owner.DIR_PREFIX}{_dead_pid()}-{me.start}-abcd1234"
    live = tmp / f"{owner.DIR_PREFIX}{me.pid}-{me.start}-efgh5678"  # this test process: alive
    for d in (orphan, live):
        (d / "repo").mkdir(parents=True)
        (d / "repo" / "f.txt").write_text("x")
    (orphan / "repo" / "f.txt").chmod(0o400)
    (orphan / "repo").chmod(0o500)  # the agent left it read-only: it must go anyway
    return orphan, live


def test_clean_removes_orphans_and_keeps_live_sandboxes(tmp, monkeypatch):
    import tempfile

    from typer.testing import CliRunner

    from kvagent.cli.app import app

    orphan, live = _planted(tmp)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # in process: no startup sweep runs first
    result = CliRunner().invoke(app, ["clean", "--no-docker"])
    assert result.exit_code == 0, result.output
    assert not orphan.exists() and live.exists()
    assert f"removed {orphan}\n" in result.output and "1 sandbox dir(s)" in result.output


def test_any_kvagent_command_sweeps_at_startup(tmp):
    orphan, live = _planted(tmp)
    proc = _kvagent("report", str(tmp / "no-such-run"), tmp=tmp)  # fails, but only after the sweep began
    assert proc.returncode != 0
    assert not orphan.exists() and live.exists()


@pytest.mark.slow
def test_clean_removes_orphaned_containers(tmp):
    from kvagent.sandbox import DockerUnavailableError, ensure_base_image
    from kvagent.sandbox.docker_backend import docker_client

    try:
        client = docker_client()
    except DockerUnavailableError as e:
        pytest.skip(str(e))
    image = ensure_base_image("kvagent/base:bookworm")
    label = {"kvagent.test": uuid.uuid4().hex}
    me = owner.Owner.me()
    dead = owner.Owner(_dead_pid(), me.start, socket.gethostname())
    elsewhere = owner.Owner(_dead_pid(), me.start, "another-host")  # cannot tell from here: kept
    made = [
        client.containers.run(
            image,
            ["sleep", "600"],
            detach=True,
            network_mode="none",
            labels={**label, owner.LABEL: "1", **o.labels()},
        )  # fmt: skip
        for o in (dead, me, elsewhere)
    ]
    try:
        from typer.testing import CliRunner

        from kvagent.cli.app import app

        result = CliRunner().invoke(app, ["clean"])  # in process: no startup sweep races it
        assert result.exit_code == 0, result.output
        key, value = next(iter(label.items()))
        left = client.containers.list(all=True, filters={"label": f"{key}={value}"})
        assert sorted(c.id for c in left) == sorted([made[1].id, made[2].id])
        # (other kvagent processes on this host may sweep it first, so its name is not checked)
    finally:
        for c in made[1:]:
            client.api.remove_container(c.id, force=True)
