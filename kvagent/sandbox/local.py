"""Local backend: a private copy of the repository in a temp dir, commands under bubblewrap.

Layout of the temp dir: repo/ (the copy, = workdir), state/ (tool state), home/ (HOME), tools/.
Under bwrap a command sees only what mounts.layout lists (system dirs, /etc without secrets, the
tools' Python, the user's bind paths, that dir and a private /tmp) and runs as SANDBOX_UID in a
user namespace; the network and PID namespaces are unshared, so killing bwrap ends every process
the command started. docs/sandbox.md says what each backend exposes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from kvagent.sandbox import mounts, owner, reaper
from kvagent.sandbox.base import BASE_ENV, DEFAULT_MAX_OUTPUT, TOOLS_SRC, Result, Sandbox, truncation_note
from kvagent.sandbox.errors import SandboxError
from kvagent.sandbox.procs import CappedReader, pipe_chunks
from kvagent.sandbox.repocopy import check_repo, copy_repo

log = logging.getLogger(__name__)
# "auto" is "bwrap" (kept for callers that pass it); only an explicit "none" runs unisolated.
# "scripted": the calls are the project's own, fixed in code (a generated episode's), not a model's:
# bwrap where it works, else unisolated, saying why in `unisolated_why`.
ISOLATIONS = ("auto", "bwrap", "none", "scripted")
# After the command returns and its process group is killed, how long a process that left the
# group (setsid) and escaped the reaper may keep its output pipe open before we stop reading.
DRAIN_S = 5.0
NO_BWRAP = (
    "{why}, and model-written commands are not run unisolated; install bubblewrap "
    "(apt-get install bubblewrap) or allow it user namespaces, or run them on the host on purpose "
    "with --isolation none (isolation='none')"
)
# The uid and gid commands run as inside the user namespace: not root, so no capability applies.
SANDBOX_UID = 1000
USERNS_HELP = (
    "bubblewrap cannot create a user namespace here ({why}); commands run as host uid {uid} "
    "(the private mounts still apply). Enable them with `sysctl -w kernel.unprivileged_userns_clone=1` "
    "or `sysctl -w user.max_user_namespaces=15000` (or an AppArmor profile for bwrap)"
)
_userns_ok: dict[str, bool] = {}  # per bwrap binary, once known: warn about a missing userns once


class LocalSandbox(Sandbox):
    def __init__(
        self,
        repo: str | Path,
        isolation: str = "auto",
        network: bool = False,
        bind: list[str] | None = None,
        bind_rw: list[str] | None = None,
    ):
        super().__init__()
        if isolation not in ISOLATIONS:
            raise SandboxError(f"unknown isolation {isolation!r}; use one of {', '.join(ISOLATIONS)}")
        src = check_repo(repo)
        # Extra host paths the user chose to show, at the same path: read-only / writable.
        self.bind = mounts.check_binds(bind, "bind")
        self.bind_rw = mounts.check_binds(bind_rw, "bind_rw")
        self.scripted = isolation == "scripted"
        self.unisolated_why: str | None = None  # a scripted sandbox's reason for running without bwrap
        self.bwrap = shutil.which("bwrap") if isolation != "none" else None
        self.isolation = "none" if isolation == "none" else "bwrap"
        if isolation != "none" and self.bwrap is None:
            self._without_bwrap("bubblewrap is not installed")
        self.network = network
        self.uid: int | None = None  # SANDBOX_UID when commands run in a user namespace
        owner.sweep_once("dirs")
        self.root = owner.make_dir()  # named after this process, so a sweep can tell it is orphaned
        try:
            self.workdir = os.path.join(self.root, "repo")
            self.state_dir = os.path.join(self.root, "state")
            self.tools_dir = os.path.join(self.root, "tools")
            self.commands_dir = os.path.join(self.tools_dir, "bin")  # installed commands (visible read-only)
            os.makedirs(self.state_dir)
            os.makedirs(os.path.join(self.root, "home"))
            os.makedirs(os.path.join(self.root, mounts.VAR_TMP))
            shutil.copytree(TOOLS_SRC, self.tools_dir, ignore=shutil.ignore_patterns("__pycache__"))
            self.tool_python = sys.executable
            self.copy_note = copy_repo(src, Path(self.workdir))
            if self.bwrap:
                self._mounts = mounts.layout(self.root, self.tools_dir, self.bind, self.bind_rw)
                self._probe_bwrap()
            self._init_repo_state()
        except BaseException:
            owner.rmtree(self.root)
            self._closed = True
            raise
        owner.track(self)

    def _probe_bwrap(self) -> None:
        """Run `true` in the real layout, so a bwrap that cannot work fails here, clearly."""
        if _userns_ok.get(self.bwrap, True):
            self.uid = SANDBOX_UID
            r = self._run_probe()
            if r.returncode == 0:
                _userns_ok[self.bwrap] = True
                return
            self.uid = None
            why = (r.stderr.strip().splitlines() or ["no message"])[-1]
            if self._run_probe().returncode != 0:
                self._bwrap_unusable(why)
                return
            log.warning(USERNS_HELP.format(why=why, uid=os.getuid()))  # once: cached below
            _userns_ok[self.bwrap] = False
        elif (r := self._run_probe()).returncode != 0:
            self._bwrap_unusable((r.stderr.strip().splitlines() or ["no message"])[-1])

    def _run_probe(self) -> subprocess.CompletedProcess:
        argv = self._argv(["true"])
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})

    def _bwrap_unusable(self, why: str) -> None:
        self._without_bwrap(f"bwrap cannot start a sandbox here ({why})")

    def _without_bwrap(self, why: str) -> None:
        if not self.scripted:
            raise SandboxError(NO_BWRAP.format(why=why))
        self.bwrap, self.uid, self.isolation, self.unisolated_why = None, None, "none", why

    def _argv(self, argv: list[str]) -> list[str]:
        if not self.bwrap:
            return argv
        wrap = [self.bwrap, *self._mounts, "--unshare-pid", "--unshare-ipc", "--die-with-parent"]
        if self.uid is not None:
            wrap += ["--unshare-user", "--uid", str(self.uid), "--gid", str(self.uid)]
            if _can_disable_userns(self.bwrap):  # bwrap >= 0.8: no nested namespace to be root in
                wrap.append("--disable-userns")
        if not self.network:
            wrap.append("--unshare-net")
        return [*wrap, "--chdir", self.workdir, "--", *argv]

    def _env(self, extra: dict | None, plain: bool = False) -> dict:
        if plain:  # PATH alone (as R2E-Gym's runtime), and the marker the reaper needs
            return {**(extra or {}), reaper.MARKER: self.root}
        path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        if self.bwrap:
            path = mounts.visible_path(path, [*mounts.interpreter_prefixes(), *self.bind, *self.bind_rw])
        elif self.scripted:  # `python` is the tools' one, as under bwrap: the script's output is the same
            path = os.pathsep.join([os.path.dirname(sys.executable), path])
        env = {
            "PATH": path,
            "HOME": os.path.join(self.root, "home"),
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
            **BASE_ENV,
        }
        env.update(extra or {})
        # The marker finds a command's processes by scan: without bwrap, those that left the group;
        # with it, a command whose owner was SIGKILLed while bwrap started, before --die-with-parent
        # took hold (the sweep ends it, owner.sweep_dirs).
        env[reaper.MARKER] = self.root
        return env

    def _exec_plain(self, argv: list[str], timeout: float, path: str) -> Result:
        return self._exec(argv, timeout, env={"PATH": path}, plain=True)

    def _command_path(self) -> str:
        # the commands' dir first, then what the sandbox's own commands see
        return os.pathsep.join([self.commands_dir, self._env(None)["PATH"]])

    def _put_executable(self, path: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)  # under the ro-bound tools dir: host-side
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, 0o755)

    def _exec(
        self,
        argv: list[str],
        timeout: float,
        max_output: int = DEFAULT_MAX_OUTPUT,
        env: dict | None = None,
        plain: bool = False,
    ) -> Result:
        self._check_open()
        start = time.monotonic()
        proc = subprocess.Popen(
            self._argv(argv),
            cwd=self.workdir,
            env=self._env(env, plain),
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
        # Returned or timed out: its background processes go too (bwrap's PID namespace does this
        # already; without bwrap the process group holds them, and the reaper those that left it).
        self._kill(proc)
        if timed_out:
            proc.wait()
        reader.join(1.0 if timed_out else max(1.0, min(DRAIN_S, timeout + start - time.monotonic())))
        proc.stdout.close()
        data = reader.output(truncation_note)
        code = 137 if timed_out else proc.returncode
        if code < 0:
            code = 128 - code
        return Result(code, data.decode("utf-8", errors="replace"), timed_out)

    def _kill(self, proc: subprocess.Popen) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if not self.bwrap:
            reaper.kill_marked(self.root)

    def _host_path(self, path: str) -> str:
        return self.confine(path, os.path.realpath(self.resolve(path)))

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
        if not self.bwrap:
            reaper.kill_marked(self.root)
        owner.untrack(self)
        owner.rmtree(self.root)


@functools.cache
def _can_disable_userns(bwrap: str) -> bool:
    r = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=30)
    return "--disable-userns" in r.stdout + r.stderr
