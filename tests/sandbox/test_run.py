"""run/read/write on both backends: exit codes, timeouts, output caps, isolation."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

from kvagent.sandbox import SandboxError, open_sandbox

from .conftest import make_repo

# Lists processes whose command line is exactly `sleep 1000.123` (the marker used below).
FIND_SLEEPERS = (
    "python3 -c \"import os; print(sum(1 for p in os.listdir('/proc') if p.isdigit() and "
    "open('/proc/'+p+'/cmdline','rb').read()==b'sleep\\x001000.123\\x00'))\""
)


def host_sleepers() -> int:
    n = 0
    for p in os.listdir("/proc"):
        if p.isdigit():
            with contextlib.suppress(OSError):
                n += Path(f"/proc/{p}/cmdline").read_bytes() == b"sleep\x001000.123\x00"
    return n


def test_exit_code_and_output(sandbox):
    r = sandbox.run("echo out; echo err >&2; exit 3", timeout=30)
    assert (r.exit_code, r.timed_out) == (3, False)
    assert r.output == "out\nerr\n"
    assert sandbox.run("cat README.md", timeout=30).output.startswith("hello\n")
    assert sandbox.run("pwd", timeout=30).output.strip() == sandbox.workdir


def test_timeout_kills_process_tree(sandbox):
    t0 = time.monotonic()
    r = sandbox.run("sleep 1000.123 & sleep 1000.123 & sleep 1000.123", timeout=2)
    elapsed = time.monotonic() - t0
    assert r.timed_out and r.exit_code != 0
    assert elapsed < 6, elapsed
    # No sleeper survives, neither inside the sandbox nor on the host.
    assert sandbox.run(FIND_SLEEPERS, timeout=30).output.strip() == "0"
    assert host_sleepers() == 0


def test_large_output_is_capped(sandbox):
    r = sandbox.run("head -c 10000000 /dev/zero | tr '\\0' x", timeout=60)
    assert r.exit_code == 0
    assert len(r.output) < 300_000
    assert "output truncated" in r.output


def test_binary_output_is_decoded(sandbox):
    r = sandbox.run("printf 'a\\xff\\xfe\\x00b\\n'; head -c 4096 /dev/urandom", timeout=30)
    assert r.exit_code == 0
    assert r.output.startswith("a\ufffd\ufffd\x00b\n")


def test_network_is_unreachable_by_default(sandbox):
    if getattr(sandbox, "bwrap", "docker") is None:
        pytest.skip("local sandbox without bwrap has the host network")
    code = "import socket; socket.create_connection(('1.1.1.1', 53), timeout=3); print('connected')"
    r = sandbox.run(f'python3 -c "{code}"', timeout=30)
    assert r.exit_code != 0 and "connected" not in r.output


def test_read_write_roundtrip(sandbox):
    sandbox.write("sub/dir/new.txt", "héllo\n")
    assert sandbox.read("sub/dir/new.txt") == "héllo\n"
    assert sandbox.run("cat sub/dir/new.txt", timeout=30).output == "héllo\n"
    assert sandbox.read(f"{sandbox.workdir}/a.py").startswith("def add")
    with pytest.raises(FileNotFoundError):
        sandbox.read("missing.txt")


def test_closed_sandbox_refuses(sandbox):
    sandbox.close()
    with pytest.raises(SandboxError, match="closed"):
        sandbox.run("true")


def test_local_writes_outside_copy_fail_under_bwrap(repo, tmp_path):
    with open_sandbox("local", repo=repo, isolation="bwrap") as sb:
        outside = tmp_path / "outside.txt"
        r = sb.run(f"echo x > {outside}; echo x > {repo}/a.py; touch /etc/kvagent-probe", timeout=30)
        assert r.exit_code != 0
        assert "Read-only file system" in r.output
        assert not outside.exists() and not Path("/etc/kvagent-probe").exists()
        # /tmp is private and writable; the copy is writable.
        assert sb.run("echo t > /tmp/x && cat /tmp/x && echo y > a.py", timeout=30).output == "t\n"
        with pytest.raises(SandboxError, match="outside the sandbox"):
            sb.write("../../outside.txt", "x")
    assert (repo / "a.py").read_text().startswith("def add")


def test_local_never_touches_the_checkout(repo):
    before = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    with open_sandbox("local", repo=repo) as sb:
        root = sb.root
        sb.run("echo changed > a.py; rm README.md; git commit -qam x -c user.name=x || true", timeout=30)
        sb.run_tool("file_editor", {"command": "create", "path": "n.py", "file_text": "x\n"})
    after = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    assert before == after
    assert not os.path.exists(root)


def test_local_plain_directory_gets_a_base_commit(tmp_path):
    src = make_repo(tmp_path / "plain", {"x.txt": "one\n"}, git=False)
    with open_sandbox("local", repo=src) as sb:
        sb.write("x.txt", "two\n")
        assert "+two" in sb.diff()
    assert not (src / ".git").exists()


def test_local_unisolated_fallback_runs(repo):
    with open_sandbox("local", repo=repo, isolation="none") as sb:
        assert sb.run("echo ok", timeout=30).output == "ok\n"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"backend": "local"}, "needs repo=PATH"),
        ({"backend": "local", "repo": "/nonexistent/kvagent"}, "not a directory"),
        ({"backend": "docker"}, "needs image=NAME"),
        ({"backend": "nope", "repo": "."}, "unknown sandbox backend"),
        ({"backend": "local", "repo": ".", "isolation": "jail"}, "unknown isolation"),
    ],
)
def test_bad_arguments_give_clear_errors(kwargs, match):
    with pytest.raises(SandboxError, match=match):
        open_sandbox(**kwargs)


def test_local_sees_a_python_that_lives_under_tmp(repo, monkeypatch):
    """A checkout (and its venv) under /tmp must stay usable although bwrap gives a private /tmp."""
    import shutil
    import sys
    import tempfile

    if not shutil.which("bwrap"):
        pytest.fail("bwrap missing: install bubblewrap (scripts/services.sh does)")
    fake_prefix = tempfile.mkdtemp(prefix="kvagent-fake-venv-", dir="/tmp")
    try:
        tool = Path(fake_prefix) / "bin" / "hello"
        tool.parent.mkdir()
        tool.write_text("#!/bin/sh\necho hello from the venv\n")
        tool.chmod(0o755)
        monkeypatch.setattr(sys, "prefix", fake_prefix)
        with open_sandbox("local", repo=repo, isolation="bwrap") as sb:
            res = sb.run(str(tool), timeout=30)
            assert (res.exit_code, res.output.strip()) == (0, "hello from the venv")
            assert sb.run(f"touch {fake_prefix}/x", timeout=30).exit_code != 0  # still read-only
    finally:
        shutil.rmtree(fake_prefix, ignore_errors=True)
