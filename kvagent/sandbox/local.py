"""Local backend: a private copy of the repository in a temp dir, commands under bubblewrap.

Layout of the temp dir: repo/ (the copy, = workdir), state/ (tool state), home/ (HOME), tools/.
Under bwrap the whole filesystem is read-only except that dir and a private /tmp; the network
and PID namespaces are unshared, so killing bwrap ends every process the command started.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvagent.sandbox.base import BASE_ENV, DEFAULT_MAX_OUTPUT, TOOLS_SRC, Result, Sandbox, truncation_note
from kvagent.sandbox.errors import SandboxError
from kvagent.sandbox.procs import CappedReader, pipe_chunks
from kvagent.sandbox.repocopy import check_repo, copy_repo

log = logging.getLogger(__name__)
ISOLATIONS = ("auto", "bwrap", "none")
# After the process exits, how long stray holders of its output pipe may keep us waiting.
DRAIN_S = 5.0


def _rmtree(path: str) -> None:
    def onerror(func, p, _exc):  # files the agent made read-only must still go
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=onerror)


class LocalSandbox(Sandbox):
    def __init__(self, repo: str | Path, isolation: str = "auto", network: bool = False):
        super().__init__()
        if isolation not in ISOLATIONS:
            raise SandboxError(f"unknown isolation {isolation!r}; use one of {', '.join(ISOLATIONS)}")
        src = check_repo(repo)
        bwrap = shutil.which("bwrap")
        if isolation == "bwrap" and bwrap is None:
            raise SandboxError("isolation='bwrap' but bwrap is not installed; install bubblewrap")
        if isolation == "auto" and bwrap is None:
            log.warning("bwrap not found: local sandbox commands run unisolated (network on, host writable)")
        self.bwrap = bwrap if isolation != "none" else None
        self.network = network
        self.root = os.path.realpath(tempfile.mkdtemp(prefix="kvagent-sbx-"))
        try:
            self.workdir = os.path.join(self.root, "repo")
            self.state_dir = os.path.join(self.root, "state")
            self.tools_dir = os.path.join(self.root, "tools")
            os.makedirs(self.state_dir)
            os.makedirs(os.path.join(self.root, "home"))
            shutil.copytree(TOOLS_SRC, self.tools_dir, ignore=shutil.ignore_patterns("__pycache__"))
            self.tool_python = sys.executable
            copy_repo(src, Path(self.workdir))
            self._init_repo_state()
        except BaseException:
            _rmtree(self.root)
            self._closed = True
            raise

    def _argv(self, argv: list[str]) -> list[str]:
        if not self.bwrap:
            return argv
        # Order matters: later mounts go on top, so the sandbox dir is bound over the private /tmp.
        wrap = [self.bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        for path in _interpreter_paths_under_tmp():
            # The private /tmp would hide a Python (e.g. a venv in a checkout under /tmp) that the
            # tools and the user's commands run with; show it again, read-only.
            wrap += ["--ro-bind", path, path]
        wrap += ["--bind", self.root, self.root, "--unshare-pid", "--unshare-ipc", "--die-with-parent"]
        if not self.network:
            wrap.append("--unshare-net")
        return [*wrap, "--chdir", self.workdir, "--", *argv]

    def _env(self, extra: dict | None) -> dict:
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": os.path.join(self.root, "home"),
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
            **BASE_ENV,
        }
        env.update(extra or {})
        return env

    def _exec(
        self, argv: list[str], timeout: float, max_output: int = DEFAULT_MAX_OUTPUT, env: dict | None = None
    ) -> Result:
        self._check_open()
        start = time.monotonic()
        proc = subprocess.Popen(
            self._argv(argv),
            cwd=self.workdir,
            env=self._env(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so one killpg reaches every child
        )
        reader = CappedReader(pipe_chunks(proc.stdout.read1), max_output)
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        except BaseException:  # Ctrl-C: do not leave the command running
            self._kill(proc)
            raise
        if timed_out:
            self._kill(proc)
            proc.wait()
        # Background children may still hold the pipe; bound the wait, then kill the group.
        drain = 1.0 if timed_out else max(1.0, min(DRAIN_S, timeout + start - time.monotonic()))
        if not reader.join(drain):
            self._kill(proc)
            reader.join(1.0)
        proc.stdout.close()
        data, dropped = reader.data()
        if dropped:
            data += truncation_note(dropped)
        code = 137 if timed_out else proc.returncode
        if code < 0:
            code = 128 - code
        return Result(code, data.decode("utf-8", errors="replace"), timed_out)

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def _host_path(self, path: str) -> str:
        p = os.path.realpath(self.resolve(path))
        if p != self.root and not p.startswith(self.root + os.sep):
            raise SandboxError(f"path {path!r} is outside the sandbox; use a path inside {self.workdir}")
        return p

    def read_bytes(self, path: str) -> bytes:
        self._check_open()
        with open(self._host_path(path), "rb") as f:
            return f.read()

    def write_bytes(self, path: str, data: bytes) -> None:
        self._check_open()
        p = self._host_path(path)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)

    def _close(self) -> None:
        _rmtree(self.root)


def _interpreter_paths_under_tmp() -> list[str]:
    """Directories of this Python (prefix, base prefix, the real executable's) that lie in /tmp."""
    candidates = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    out = []
    for path in sorted(os.path.realpath(p) for p in candidates):
        if (path == "/tmp" or path.startswith("/tmp/")) and not any(path.startswith(o + "/") for o in out):
            out.append(path)
    return out
