"""Issue 33: the demo's episode calls are the project's own (scripted by the generator), so `make demo`
runs them in the best sandbox the machine has, saying which in one line, where model-written
commands are refused without isolation."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kvagent.cli.settings import EngineOptions
from kvagent.sandbox import SandboxError, open_sandbox
from kvagent.sandbox import local as local_backend


def _path_without(tmp_path: Path, *names: str) -> str:
    """A PATH of one directory holding links to every program on today's PATH except `names`."""
    bin_dir = tmp_path / f"path-without-{'-'.join(names)}"
    bin_dir.mkdir()
    for d in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for entry in os.scandir(d):
            link = bin_dir / entry.name
            if entry.name not in names and not link.exists() and not link.is_symlink():
                link.symlink_to(entry.path)
    return str(bin_dir)


def test_demo_completes_and_writes_its_table_where_bubblewrap_is_missing(tmp_path, monkeypatch, capsys):
    from kvagent.bench.fidelity.tables import row_name
    from kvagent.cli.demo import run_demo
    from kvagent.runspec import RunSpec

    # A fresh Debian: no bubblewrap, and python3 but no `python` (the episode's calls run `python`).
    monkeypatch.setenv("PATH", _path_without(tmp_path, "bwrap", "python"))
    assert shutil.which("bwrap") is None and shutil.which("python") is None
    out = tmp_path / "out"
    records = run_demo(
        EngineOptions(model="tiny-random-qwen3"),
        out=str(out),
        budget=512,
        turns=10,
        progress=False,
        policies=("random",),
    )
    printed = capsys.readouterr().out
    assert "sandbox: unisolated (bubblewrap is not installed; the demo's calls are scripted)" in printed
    assert "Fidelity vs the full cache" in printed
    assert {(r["policy"], r["mode"]) for r in records} >= {("full", "persistent"), ("random", "reprefill")}
    rec = next(r for r in records if (r["policy"], r["mode"]) == ("random", "persistent"))
    name = row_name(RunSpec.from_record(rec).configuration)  # e.g. random+recent-buffer
    assert f"| {name} | persistent |" in (out / "fidelity.md").read_text()


def test_the_generated_episode_reads_the_same_without_bubblewrap_or_a_python_on_path(tmp_path, monkeypatch):
    from kvagent.bench.generator import generate_episode
    from kvagent.cli.environments import scripted_sandbox

    def episode() -> list[dict]:
        return generate_episode(seed=0, turns=12, prompt="compact", open_env=scripted_sandbox).messages

    under_bwrap = episode() if shutil.which("bwrap") else None
    monkeypatch.setenv("PATH", _path_without(tmp_path, "bwrap", "python"))
    messages = episode()
    text = "\n".join(m["content"] for m in messages)
    assert "1h30m 1800 WRONG (expected 5400)" in text and "1h30m 5400 OK" in text and "Ran 7 tests" in text
    assert "command not found" not in text
    if under_bwrap is not None:  # where bubblewrap is installed (make test installs it): token for token
        assert messages == under_bwrap


def _bwrap_that_cannot_start(tmp_path: Path, monkeypatch) -> None:
    fake = tmp_path / "fakebin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "bwrap: No permissions to create new namespace" >&2\nexit 1\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(local_backend, "_userns_ok", {})


def test_a_scripted_sandbox_runs_unisolated_where_bwrap_cannot_start_and_says_why(tmp_path, monkeypatch):
    from kvagent.cli.environments import sandbox_line, scripted_sandbox

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("hi\n")
    _bwrap_that_cannot_start(tmp_path, monkeypatch)
    with scripted_sandbox(repo) as sb:
        assert sb.bwrap is None and sb.run("cat a.txt", timeout=30).output == "hi\n"
        line = sandbox_line(sb, "the demo's")
    assert line.startswith("sandbox: unisolated (bwrap cannot start a sandbox here")
    assert "No permissions" in line and line.endswith("the demo's calls are scripted)")
    # Model-written commands keep refusing on the same machine.
    with pytest.raises(SandboxError, match="bwrap cannot start a sandbox here .*--isolation none"):
        open_sandbox("local", repo=repo)


def test_model_written_commands_still_refuse_where_bubblewrap_is_missing(tmp_path, monkeypatch):
    from kvagent.cli.environments import local_env
    from kvagent.evals.datasets import Instance

    repos = tmp_path / "repos"
    (repos / "x__y-1").mkdir(parents=True)
    monkeypatch.setenv("PATH", _path_without(tmp_path, "bwrap"))
    with pytest.raises(SandboxError, match="not installed.*--isolation none"):
        open_sandbox("local", repo=repos / "x__y-1")
    inst = Instance("x__y-1", "x/y", "HEAD", "p", "", [], [])
    with pytest.raises(SandboxError, match="not installed.*--isolation none"):
        local_env(repos)(inst)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed (make test installs it)")
def test_a_scripted_sandbox_uses_bwrap_where_it_works(tmp_path):
    from kvagent.cli.environments import sandbox_line, scripted_sandbox

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("hi\n")
    with scripted_sandbox(repo) as sb:
        assert sb.bwrap is not None and sb.unisolated_why is None
        assert sb.run("ls /etc/shadow", timeout=30).exit_code != 0  # the private mounts apply
        assert sandbox_line(sb, "the demo's") in ("sandbox: bwrap", "sandbox: bwrap without a user namespace "
                                                  "(commands run as the invoking user)")  # fmt: skip
