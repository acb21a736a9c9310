"""The host's private files stay invisible to the agent (docs/sandbox.md).

A secret is planted where a model-written command might look for it (the invoking user's home,
/root when run as root); commands in the sandbox must not read it and diff() must not carry it.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import sys
import uuid
from pathlib import Path

import pytest

from kvagent.sandbox import SandboxError, open_sandbox
from kvagent.sandbox import local as local_backend

from .conftest import open_backend

SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")


@pytest.fixture
def secrets():
    """Files only their owner may read, in each private place this user can write to."""
    places = [Path.home()]
    if os.geteuid() == 0 and Path("/root").resolve() != Path.home().resolve():
        places.append(Path("/root"))
    planted = {}
    for place in places:
        token = f"secret-content-{uuid.uuid4().hex}"  # the file's name does not give it away
        path = place / f".kvagent-secret-{uuid.uuid4().hex}"
        path.write_text(token + "\n")
        path.chmod(0o600)
        planted[path] = token
    yield planted
    for path in planted:
        path.unlink(missing_ok=True)


def test_planted_secrets_are_unreadable_and_never_reach_the_diff(repo, secrets):
    with open_sandbox("local", repo=repo, isolation="bwrap") as sb:
        for path, token in secrets.items():
            r = sb.run(
                f"cat {path}; cp {path} stolen.txt; cat {path} > leak.txt; ls -a {path.parent}", timeout=30
            )
            assert token not in r.output
            assert "No such file or directory" in r.output
            # Nothing the agent finds by looking around either (/usr and /proc are too big to scan).
            found = sb.run(f"grep -rs {token} /root /home /tmp /etc / --exclude-dir=* | head -3", timeout=120)
            assert token not in found.output
        patch = sb.diff()
    assert all(token not in patch for token in secrets.values())


def test_host_private_places_are_absent(repo):
    with open_sandbox("local", repo=repo, isolation="bwrap") as sb:
        for path in ("/etc/shadow", "/etc/gshadow", "/etc/ssh", *SOCKETS, "/home", "/var/run", "/run"):
            assert sb.run(f"ls -d {path}", timeout=30).exit_code != 0, f"{path} is visible in the sandbox"
        assert (
            sb.run("ls -A /var /var/tmp", timeout=30).output == "/var:\ntmp\n\n/var/tmp:\n"
        )  # its own, empty
        r = sb.run("ls -A /root", timeout=30)
        # At most the path down to the interpreter's prefix (e.g. /root/.pyenv/versions/X).
        prefixes = [p for p in local_backend.mounts.interpreter_prefixes() if p.startswith("/root/")]
        allowed = {p.split("/")[2] for p in prefixes}
        assert set(r.output.split()) <= allowed
        # The public parts of /etc stay, so users and certificates resolve.
        assert sb.run("test -s /etc/passwd && getent passwd root", timeout=30).exit_code == 0


def test_etc_keeps_only_world_readable_files(repo):
    hidden = []
    for top, dirs, files in os.walk("/etc"):
        for name in dirs + files:
            p = os.path.join(top, name)
            st = os.lstat(p)
            if not stat.S_ISLNK(st.st_mode) and not st.st_mode & stat.S_IROTH:
                hidden.append(p)
    if not hidden:
        pytest.skip("this host's /etc has no owner-only file to hide")
    with open_sandbox("local", repo=repo, isolation="bwrap") as sb:
        for p in hidden[:20]:
            r = sb.run(f"find {p} -type f -size +0 2>/dev/null", timeout=30)
            assert r.output.strip() == "", f"{p} is readable in the sandbox: {r.output[:200]}"


def test_commands_run_unprivileged_with_an_empty_home(repo):
    with open_sandbox("local", repo=repo, isolation="bwrap") as sb:
        assert sb.uid == local_backend.SANDBOX_UID  # user namespaces work on the test machines
        r = sb.run('id -u; id -g; echo "$HOME"; ls -A "$HOME"', timeout=30)
        assert r.output.split() == [str(sb.uid), str(sb.uid), f"{sb.root}/home"]
        # The tools' files cannot be rewritten by a command.
        assert sb.run(f"echo x >> {sb.tools_dir}/finish.py", timeout=30).exit_code != 0


def test_tools_git_python_and_pytest_still_work(repo):
    with open_sandbox("local", repo=repo, isolation="bwrap") as sb:
        sb.write("test_a.py", "from a import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n")
        assert "def add" in sb.run_tool("file_editor", {"command": "view", "path": "a.py"}).output
        assert "a.py" in sb.run_tool("search", {"search_term": "add"}).output
        r = sb.run_tool("execute_bash", {"cmd": "git status --short && echo ok"})
        assert "ok" in r.output
        assert sb.run("python3 -c 'print(6 * 7)'", timeout=30).output == "42\n"
        # The repository's own test command, as grading runs it.
        r = sb.run(f"{sys.executable} -m pytest -q -p no:cacheprovider test_a.py", timeout=120)
        assert r.exit_code == 0, r.output
        assert "1 passed" in r.output
        sb.run("echo '# edit' >> a.py", timeout=30)
        assert "+# edit" in sb.diff()


def test_named_paths_are_shown_read_only_or_writable(repo, tmp_path):
    ro = tmp_path / "data"
    ro.mkdir()
    (ro / "x.txt").write_text("shared\n")
    rw = tmp_path / "out"
    rw.mkdir()
    with open_sandbox("local", repo=repo, isolation="bwrap", bind=[str(ro)], bind_rw=[rw]) as sb:
        assert sb.bind == (str(ro),) and sb.bind_rw == (str(rw),)
        assert sb.run(f"cat {ro}/x.txt", timeout=30).output == "shared\n"
        assert sb.run(f"touch {ro}/y", timeout=30).exit_code != 0
        assert sb.run(f"echo made > {rw}/z.txt", timeout=30).exit_code == 0
        # A sibling of a named path stays hidden.
        assert sb.run(f"ls {tmp_path}", timeout=30).output.split() == sorted(["data", "out"])
    assert (rw / "z.txt").read_text() == "made\n" and not (ro / "y").exists()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bind": ["/nonexistent/kvagent-bind"]}, "bind path '/nonexistent/kvagent-bind' does not exist"),
        ({"bind_rw": "/tmp"}, r"takes a list of paths; write bind_rw=\['/tmp'\]"),
        ({"bind": ["/"]}, "would show the whole host"),
    ],
)
def test_bad_bind_options_give_clear_errors(repo, kwargs, match):
    with pytest.raises(SandboxError, match=match):
        open_sandbox("local", repo=repo, **kwargs)


def _fake_bwrap(tmp_path: Path, monkeypatch, refuse: str) -> None:
    """A bwrap on PATH that fails like a host without user namespaces (refuse='--unshare-user')
    or without any working bwrap (refuse='--')."""
    real = shutil.which("bwrap")
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        f'for a in "$@"; do [ "$a" = "{refuse}" ] && '
        '{ echo "bwrap: No permissions to create new namespace" >&2; exit 1; }; done\n'
        f'exec {real} "$@"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(local_backend, "_userns_ok", {})


def test_without_user_namespaces_it_warns_once_and_keeps_the_mounts(repo, tmp_path, monkeypatch, caplog):
    _fake_bwrap(tmp_path, monkeypatch, "--unshare-user")
    with caplog.at_level(logging.WARNING, logger=local_backend.__name__):
        with open_sandbox("local", repo=repo, isolation="bwrap") as sb:
            assert sb.uid is None
            assert sb.run("ls /etc/shadow", timeout=30).exit_code != 0
        with open_sandbox("local", repo=repo, isolation="bwrap") as sb:
            assert sb.run("echo ok", timeout=30).output == "ok\n"
    warned = [r.getMessage() for r in caplog.records if "user namespace" in r.getMessage()]
    assert len(warned) == 1 and "No permissions" in warned[0] and "sysctl" in warned[0]


def test_a_bwrap_that_cannot_start_is_refused_at_open(repo, tmp_path, monkeypatch):
    _fake_bwrap(tmp_path, monkeypatch, "--")
    with pytest.raises(SandboxError, match="bwrap cannot start a sandbox here .*No permissions"):
        open_sandbox("local", repo=repo, isolation="bwrap")


@pytest.mark.slow
def test_docker_mounts_nothing_of_the_host(repo, request, secrets):
    with open_backend("docker", repo, request) as sb:
        sb.container.reload()
        assert sb.container.attrs["Mounts"] == []
        assert not sb.container.attrs["HostConfig"].get("Binds")
        r = sb.run("ls /var/run/docker.sock /run/docker.sock", timeout=30)
        assert r.exit_code != 0 and "No such file or directory" in r.output
        for path, token in secrets.items():
            assert token not in sb.run(f"cat {path}", timeout=30).output


def _no_bwrap(monkeypatch) -> None:
    real = shutil.which
    monkeypatch.setattr(
        local_backend.shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real(name, *a, **k)
    )


@pytest.mark.parametrize("isolation", ["auto", "bwrap"])
def test_without_bwrap_model_commands_refuse_to_run_unisolated(repo, monkeypatch, isolation):
    """Issue 16.10: no silent fallback; the error names both ways out."""
    _no_bwrap(monkeypatch)
    with pytest.raises(SandboxError, match=r"not installed.*install bubblewrap.*--isolation none"):
        open_sandbox("local", repo=repo, isolation=isolation)
    with open_sandbox("local", repo=repo, isolation="none") as sb:  # said explicitly: runs on the host
        assert sb.bwrap is None and sb.run("echo ok", timeout=30).output == "ok\n"


def test_a_bwrap_that_cannot_start_is_refused_by_default_too(repo, tmp_path, monkeypatch):
    _fake_bwrap(tmp_path, monkeypatch, "--")
    with pytest.raises(SandboxError, match="bwrap cannot start a sandbox here .*--isolation none"):
        open_sandbox("local", repo=repo)


def test_isolation_option_reaches_every_local_sandbox(repo, tmp_path):
    """--isolation is threaded into solve/chat (the spec) and eval (episodes and grading)."""
    from kvagent.cli import environments
    from kvagent.errors import ConfigError
    from kvagent.evals.datasets import Instance

    local = {"backend": "local", "repo": str(repo)}
    assert environments.with_isolation(local, "none") == {**local, "isolation": "none"}
    assert environments.with_isolation({"backend": "docker", "image": "x"}, "none") == {
        "backend": "docker",
        "image": "x",
    }
    with pytest.raises(ConfigError, match="isolation: got 'jail'; use bwrap"):
        environments.with_isolation(local, "jail")
    repos = tmp_path / "repos"
    repos.mkdir()
    shutil.copytree(repo, repos / "x__y-1", symlinks=True)
    inst = Instance("x__y-1", "x/y", "0" * 40, "p", test_patch="", FAIL_TO_PASS=[], PASS_TO_PASS=[])
    with environments.local_env(repos, "none")(inst) as sb:
        assert sb.bwrap is None
    with environments.local_env(repos)(inst) as sb:
        assert sb.bwrap is not None


def test_cli_rejects_a_bad_isolation_before_loading_a_model(repo):
    from typer.testing import CliRunner

    from kvagent.cli.app import app

    result = CliRunner().invoke(app, ["solve", "--issue", "x", "--repo", str(repo), "--isolation", "jail"])
    assert result.exit_code == 2 and "isolation: got 'jail'" in result.output
