"""Docker backend: one container per episode, repository at /testbed, no network by default.

PID 1 is `/bin/bash -l` with a tty, as in R2E-Gym's containers (docs/deepswe.md). kvagent's own
commands run under `timeout -s KILL`, which puts the command in its own process group; that whole
group is killed at the deadline and when the command returns, so nothing it started in the
background outlives it. A command run as R2E-Gym's runtime runs one (`_exec_plain`) is exec'd as
it is, its stdout and stderr docker's two streams, and what it leaves running stays until close, as
there. kvagent's tools and state (/kvagent) are copied in at the first `run_tool`, not before. The
container is removed on close(), on an exception in a `with` block, on Ctrl-C or SIGTERM
(KeyboardInterrupt unwinds through close), and at interpreter exit; after a SIGKILL, its owner
labels let the next sweep (kvagent.sandbox.owner) remove it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import posixpath
import shlex
import tarfile
import time
import uuid
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from kvagent.sandbox import commands, owner
from kvagent.sandbox.base import (
    BASE_ENV,
    DEFAULT_MAX_OUTPUT,
    TOOLS_SRC,
    Result,
    Sandbox,
    truncation_note,
)
from kvagent.sandbox.errors import DockerUnavailableError, SandboxError
from kvagent.sandbox.procs import CappedReader
from kvagent.sandbox.repocopy import check_repo, copy_repo

log = logging.getLogger(__name__)

LABEL = owner.LABEL
KV_DIR = "/kvagent"  # tools and state live outside the repo so they never show up in diffs
# Stream wait past the command's own timeout before we stop reading (a daemon escaped the group).
STREAM_GRACE_S = 10.0
# SWE-bench images keep the task's environment in a conda env; R2E images in a venv in the repo.
SETUP_PROBE = """
if [ -f /opt/miniconda3/bin/activate ] && [ -d /opt/miniconda3/envs/testbed ]; then
  echo "source /opt/miniconda3/bin/activate testbed"
elif [ -f {wd}/.venv/bin/activate ]; then
  echo "source {wd}/.venv/bin/activate"
fi
"""
# The tools need python >= 3.7; a conda base python is newer than an old task env's.
PYTHON_PROBE = """
for p in /opt/miniconda3/bin/python3 /usr/bin/python3 /usr/local/bin/python3; do
  if [ -x "$p" ]; then echo "$p"; exit 0; fi
done
command -v python3 || command -v python || exit 1
"""
# R2E images keep the task's interpreter here (python 3.6 on old tasks); R2E-Gym's tools run under it
# (their `#!/root/.venv/bin/python`), so the r2egym tool scripts do too where it exists.
TASK_PYTHON = "/root/.venv/bin/python"

# PID 1: R2E-Gym's (`/bin/bash -l`, a tty, stdin open; bash reaps orphans as docker-init would). Every
# image a sandbox opens needs bash anyway (its git set-up runs under it).
PID1 = {"entrypoint": ["/bin/bash", "-l"], "tty": True, "stdin_open": True}
# Runs `timeout -s KILL T CMD...` in the background so its pid (= its process group: timeout
# makes itself a group leader) is known, then kills that group once the command returns.
GROUP_WRAPPER = (
    't=$1; shift; timeout -s KILL "$t" "$@" 2>&1 & pid=$!; '
    'wait $pid 2>/dev/null; rc=$?; kill -s KILL -- "-$pid" 2>/dev/null; exit $rc'
)
# Prints the interpreter's X.Y and its site-packages where `module` cannot be imported; nothing else.
MODULE_PROBE = """import sys, sysconfig
try:
    import {module}
except ImportError:
    print("%d.%d" % sys.version_info[:2])
    print(sysconfig.get_paths()["purelib"])
"""
# Resolves symlinks inside the container, so read/write are confined like the local backend's.
REALPATH = "import os, sys; print(os.path.realpath(sys.argv[1]))"


def docker_client():
    """A connected docker client, or a one-line error saying how to start Docker."""
    try:
        import docker
    except ImportError as e:  # pragma: no cover - docker is a core dependency
        raise DockerUnavailableError("the `docker` Python package is missing; pip install 'docker>=7'") from e
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as e:
        raise DockerUnavailableError(
            f"cannot reach the Docker daemon ({type(e).__name__}); start it (`dockerd`) or set DOCKER_HOST"
        ) from e
    return client


def _version(xy: str) -> tuple[int, ...]:
    return tuple(int(p) for p in xy.split("."))


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _tar(files: dict[str, bytes], dirs: tuple[str, ...] = (), mode: int = 0o644) -> bytes:
    buf = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, now
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, now
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class DockerSandbox(Sandbox):
    def __init__(
        self,
        image: str,
        *,
        network: bool = False,
        mem_limit: str = "8g",
        pids_limit: int = 2048,
        setup: str | None = "auto",
        repo: str | Path | None = None,
        workdir: str = "/testbed",
        labels: dict[str, str] | None = None,
        pull: bool = False,
        client=None,
    ):
        super().__init__()
        self._closed = True  # until the container exists
        import docker.errors

        self._errors = docker.errors
        src = check_repo(repo) if repo is not None else None
        self.client = client or docker_client()
        self.image = image
        self.workdir = workdir.rstrip("/") or "/"
        self.tools_dir = f"{KV_DIR}/tools"
        self.state_dir = f"{KV_DIR}/state"
        self.setup = setup or ""
        self._ensure_image(pull)
        owner.sweep_once("containers", self.client)
        name = f"kvagent-{uuid.uuid4().hex[:12]}"
        self.container = None
        try:
            self.container = self._start(name, network, mem_limit, pids_limit, labels)
            self._closed = False
            owner.track(self)
            self._provision(src)
        except BaseException as e:
            self._remove(name)
            self._closed = True
            if isinstance(e, self._errors.DockerException):
                raise SandboxError(f"docker: {_first_line(e)} (image {image})") from None
            raise

    def _start(self, name, network, mem_limit, pids_limit, labels):
        return self.client.containers.run(
            self.image,
            command=[],
            name=name,
            detach=True,
            network_mode="bridge" if network else "none",
            mem_limit=mem_limit,
            pids_limit=pids_limit,
            # The owner, so a sweep can remove the container once this process is gone.
            labels={**(labels or {}), LABEL: "1", **owner.Owner.me().labels()},
            **PID1,
        )

    # --- set-up ---------------------------------------------------------------------------------
    def _ensure_image(self, pull: bool) -> None:
        try:
            self.client.images.get(self.image)
            return
        except self._errors.ImageNotFound:
            pass
        if not pull:
            raise SandboxError(
                f"docker image {self.image!r} not found locally; `docker pull {self.image}`, pass pull=True, "
                "or build the base image with `kvagent images base`"
            )
        try:
            self.client.images.pull(self.image)
        except self._errors.APIError as e:
            raise SandboxError(
                f"cannot pull {self.image!r} ({e.explanation}); check the name and registry"
            ) from e

    def _provision(self, src: Path | None) -> None:
        self._tools_ready = False
        if src is not None:
            self._copy_in(src)
        r = self._exec_raw(["sh", "-c", f"test -d {shlex.quote(self.workdir)}"], 60)
        if r.exit_code != 0:
            raise SandboxError(f"image {self.image!r} has no {self.workdir}; pass repo=PATH or workdir=DIR")
        py = self._exec_raw(["sh", "-c", PYTHON_PROBE], 60)
        if py.exit_code != 0:
            raise SandboxError(
                f"image {self.image!r} has no python3 for the tools; use an image with python3"
            )
        self.tool_python = py.output.strip().splitlines()[-1]
        task = self._exec_raw(["sh", "-c", f"test -x {TASK_PYTHON} && {TASK_PYTHON} -c 'print(1)'"], 60)
        self.task_python = TASK_PYTHON if task.exit_code == 0 and task.output.strip() == "1" else None
        if self.setup == "auto":
            probe = self._exec_raw(["sh", "-c", SETUP_PROBE.format(wd=shlex.quote(self.workdir))], 60)
            self.setup = probe.output.strip()
        self._init_repo_state()

    def _prepare_tools(self) -> None:
        """kvagent's tool scripts and state dir, copied in at the first tool call: a sandbox that runs
        only R2E-Gym's commands shows no /kvagent, as R2E-Gym's containers have none."""
        if self._tools_ready:
            return
        # every script of TOOLS_SRC, like the local backend: the tools import _toolkit.py from their directory
        tools = {
            f"{self.tools_dir[1:]}/{f.relative_to(TOOLS_SRC)}": f.read_bytes()
            for f in sorted(TOOLS_SRC.rglob("*.py"))  # tools/r2egym/ too
        }
        subdirs = tuple(
            f"{self.tools_dir[1:]}/{d.name}"
            for d in sorted(TOOLS_SRC.iterdir())
            if d.is_dir() and d.name != "__pycache__"
        )
        self._put("/", _tar(tools, dirs=(KV_DIR[1:], self.tools_dir[1:], *subdirs, self.state_dir[1:])))
        self._tools_ready = True

    @contextlib.contextmanager
    def _scratch(self) -> Iterator[str]:
        """The state dir for one of kvagent's own operations (a diff); made for it and removed after
        when kvagent's tools have not been copied in."""
        made = not self._tools_ready and self._exec_raw(["test", "-e", KV_DIR], 60).exit_code != 0
        if not self._tools_ready:
            self._exec_raw(["mkdir", "-p", self.state_dir], 60)
        try:
            yield self.state_dir
        finally:
            if made:  # not an image's own /kvagent
                self._exec_raw(["rm", "-rf", KV_DIR], 60)

    def _copy_in(self, src: Path) -> None:
        tmp = owner.make_dir()  # swept like a local sandbox's if this process is killed here
        try:
            copy = Path(tmp) / "repo"
            self.copy_note = copy_repo(src, copy)
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                tar.add(str(copy), arcname=self.workdir.lstrip("/"))
        finally:
            owner.rmtree(tmp)
        self._exec_raw(["rm", "-rf", self.workdir], 120)
        self._put("/", buf.getvalue())

    # --- primitives -----------------------------------------------------------------------------
    def _exec_raw(
        self, argv, timeout, max_output=DEFAULT_MAX_OUTPUT, env=None, workdir="/", plain=False
    ) -> Result:
        """exec in the container under `timeout -s KILL` (which kills the command's whole group);
        `plain`: R2E-Gym's way, argv exec'd as it is (no group kill, separate streams) with only `env`
        on top of the image's own environment."""
        api = self.client.api
        env = {**({} if plain else {"LANG": "C.UTF-8", **BASE_ENV}), **(env or {})}
        if plain:  # as R2E-Gym's exec_run: the command as it is, stdout and stderr docker's two streams
            wrapped = list(argv)
        else:
            # stderr joins stdout inside the container: docker ships the two streams separately and
            # their interleaving would otherwise depend on timing, not on the order they were written.
            wrapped = ["sh", "-c", GROUP_WRAPPER, "sh", f"{max(timeout, 0.001):.3f}", *argv]
        exec_id = api.exec_create(self.container.id, wrapped, workdir=workdir, environment=env)["Id"]
        start = time.monotonic()
        stream = api.exec_start(exec_id, stream=True)
        reader = CappedReader(stream, max_output)
        ended = reader.join(timeout + STREAM_GRACE_S)
        if not ended:  # a process escaped the group and holds the stream; stop listening
            with contextlib.suppress(Exception):
                stream.close()
        data = reader.output(truncation_note)
        code = api.exec_inspect(exec_id).get("ExitCode")
        elapsed = time.monotonic() - start
        timed_out = not ended or (code in (124, 137) and elapsed >= timeout)
        if timed_out or code is None:
            code = 137
        return Result(code, data.decode("utf-8", errors="replace"), timed_out)

    def _exec(self, argv, timeout, max_output=DEFAULT_MAX_OUTPUT, env=None) -> Result:
        self._check_open()
        try:
            return self._exec_raw(argv, timeout, max_output, env, workdir=self.workdir)
        except self._errors.DockerException as e:  # e.g. the container died
            raise SandboxError(f"docker: {_first_line(e)}") from None

    def _exec_plain(self, argv, timeout, path) -> Result:
        self._check_open()
        try:
            return self._exec_raw(argv, timeout, env={"PATH": path}, workdir=self.workdir, plain=True)
        except self._errors.DockerException as e:
            raise SandboxError(f"docker: {_first_line(e)}") from None

    def _put_executable(self, path: str, data: bytes) -> None:
        parent, name = posixpath.split(path)
        self._exec_raw(["mkdir", "-p", parent], 60)
        self._put(parent, _tar({name: data}, mode=0o755))

    def link_task_venv(self) -> None:
        self._check_open()
        self._exec_raw(["sh", "-c", commands.LINK_TASK_VENV], 60)
        if self.task_python is None:  # the link may have just made it
            task = self._exec_raw(["sh", "-c", f"{TASK_PYTHON} -c 'print(1)'"], 60)
            self.task_python = TASK_PYTHON if task.exit_code == 0 and task.output.strip() == "1" else None

    def provide_module(self, module: str, wheels: Mapping[str, bytes]) -> str | None:
        """R2E-Gym's `python -m pip install MODULE` in a SWE-bench image, offline: where the task's
        interpreter cannot import `module`, the pure wheel for its Python (`wheels`: lowest Python
        X.Y -> wheel bytes) is unpacked into its site-packages. Returns the Python it did this for,
        or None (importable already, no task interpreter, or no wheel for that Python)."""
        self._check_open()
        if not self.task_python:
            return None
        r = self._exec_raw([self.task_python, "-c", MODULE_PROBE.format(module=module)], 60)
        lines = r.output.strip().splitlines()
        if r.exit_code != 0 or len(lines) != 2:
            return None
        python, purelib = lines
        have = [k for k in wheels if _version(k) <= _version(python)]
        if not have:
            return None
        with zipfile.ZipFile(io.BytesIO(wheels[max(have, key=_version)])) as whl:
            files = {n: whl.read(n) for n in whl.namelist() if not n.endswith("/")}
        dirs = sorted({"/".join(n.split("/")[:i]) for n in files for i in range(1, n.count("/") + 1)})
        self._exec_raw(["mkdir", "-p", purelib], 60)
        self._put(purelib, _tar(files, dirs=tuple(dirs)))
        return python

    def _put(self, dest_dir: str, data: bytes) -> None:
        if not self.container.put_archive(dest_dir, data):
            raise SandboxError(f"copying into {dest_dir} of the container failed")

    def _confined(self, path: str) -> str:
        p = self.confine(path)  # outside the tree: refused before anything runs
        r = self._exec_raw([self.tool_python, "-c", REALPATH, p], 60)
        real = r.output.strip().splitlines()[-1] if r.exit_code == 0 and r.output.strip() else p
        return self.confine(path, real)

    def read_bytes(self, path: str) -> bytes:
        self._check_open()
        p = self._confined(path)
        try:
            chunks, _stat = self.container.get_archive(p)
        except self._errors.NotFound as e:
            raise FileNotFoundError(f"no such file in the sandbox: {p}") from e
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            member = tar.next()
            if member is None or not member.isfile():
                raise IsADirectoryError(f"not a regular file in the sandbox: {p}")
            return tar.extractfile(member).read()

    def write_bytes(self, path: str, data: bytes) -> None:
        self._check_open()
        p = self._confined(path)
        parent, name = posixpath.split(p)
        tarball = _tar({name: data})
        try:
            self._put(parent, tarball)
        except self._errors.NotFound:  # missing parent directories: create, then retry once
            self._exec_raw(["mkdir", "-p", parent], 60)
            self._put(parent, tarball)

    def _remove(self, name_or_id: str) -> None:
        with owner.held_signals():
            try:
                self.client.api.remove_container(name_or_id, force=True, v=True)
            except self._errors.NotFound:
                pass
            except self._errors.APIError as e:
                if "already in progress" not in str(e):
                    log.warning("could not remove container %s: %s", name_or_id, e)

    def _close(self) -> None:
        owner.untrack(self)
        if self.container is not None:
            self._remove(self.container.id)
