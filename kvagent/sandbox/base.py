"""The Sandbox contract shared by all backends, and the pieces built on top of it.

A backend implements four primitives (`_exec`, `read_bytes`, `write_bytes`, `_close`); `run`,
`run_tool`, `diff` and the context manager are common so both backends behave identically.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import shlex
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from kvagent.sandbox import commands, gitdiff
from kvagent.sandbox.errors import SandboxError

TOOLS_SRC = Path(__file__).parent / "tools"
TOOL_NAMES = ("file_editor", "execute_bash", "search", "finish")
# The same four as R2E-Gym's scaffold has them behave (tools/r2egym/; the agent's `r2egym` profile).
R2EGYM_TOOL_NAMES = tuple(f"r2egym/{name}" for name in TOOL_NAMES)
# Bytes of combined output kept from one command: its first and last halves, the middle read and
# dropped so a chatty command cannot exhaust memory (procs.CappedReader). The agent (or the tool)
# truncates further for the model.
DEFAULT_MAX_OUTPUT = 256 * 1024
# Non-interactive defaults: pagers and editors would otherwise wait for a terminal forever.
BASE_ENV = {
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "MANPAGER": "cat",
    "LESS": "-R",
    "TERM": "dumb",
    "PIP_PROGRESS_BAR": "off",
    "PYTHONIOENCODING": "utf-8",
    "GIT_TERMINAL_PROMPT": "0",
}
# The outer wall clock of run_tool exceeds the tool's own limit so the tool can report the timeout.
TOOL_GRACE_S = 15.0
PARAMS_ENV_MAX = 64 * 1024


@dataclass(frozen=True)
class Result:
    exit_code: int
    output: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def _inside(path: str, top: str) -> bool:
    top = top.rstrip("/") or "/"
    return path == top or path.startswith(top.rstrip("/") + "/")


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def truncation_note(dropped: int) -> bytes:
    return f"\n[... output truncated: {dropped} bytes in the middle not shown ...]\n".encode()


class Sandbox(ABC):
    """One episode's isolated copy of a repository (docs/architecture.md, sandbox)."""

    workdir: str  # the repository path as commands inside the sandbox see it
    tools_dir: str  # where the tool scripts live inside the sandbox
    state_dir: str  # writable scratch kept for the sandbox's lifetime (editor history, params)
    tool_python: str  # interpreter used for tool scripts
    task_python: str | None = None  # the task's own interpreter, if any: the r2egym tools run under it
    setup: str = ""  # shell prefix run before every command (e.g. conda activation)
    base_commit: str = ""
    copy_note: str = ""  # one line when the copy carried uncommitted changes of the checkout
    commands_dir: str = commands.COMMANDS_DIR  # where install_commands puts scripts

    def __init__(self) -> None:
        self._closed = False
        self._runners: dict[str, str] = {}  # installed command -> how a call runs it

    # --- backend primitives -------------------------------------------------------------------
    @abstractmethod
    def _exec(
        self, argv: list[str], timeout: float, max_output: int = DEFAULT_MAX_OUTPUT, env: dict | None = None
    ) -> Result:
        """Run argv in workdir; kill its whole process tree at `timeout`; cap combined output."""

    @abstractmethod
    def _exec_plain(self, argv: list[str], timeout: float, path: str) -> Result:
        """`_exec` with `PATH` the only variable kvagent sets (R2E-Gym's runtime sets no other)."""

    @abstractmethod
    def _put_executable(self, path: str, data: bytes) -> None:
        """Write an executable file (mode 755) at `path`, which may lie outside the working tree."""

    @abstractmethod
    def read_bytes(self, path: str) -> bytes: ...

    @abstractmethod
    def write_bytes(self, path: str, data: bytes) -> None: ...

    @abstractmethod
    def _close(self) -> None: ...

    # --- common API -----------------------------------------------------------------------------
    def resolve(self, path: str) -> str:
        """A path inside the sandbox: relative paths are taken from workdir."""
        if not path:
            raise SandboxError("empty path; pass a file path relative to the repository")
        p = path if path.startswith("/") else f"{self.workdir.rstrip('/')}/{path}"
        return p

    def confine(self, path: str, real: str | None = None) -> str:
        """`path` made absolute and normalised; a SandboxError unless it (and `real`, the path with
        symlinks resolved, when the backend knows it) lies in the working tree or the state dir.
        Both backends apply this one rule to `read`/`write`. Returns the resolved path."""
        p = posixpath.normpath(self.resolve(path))
        for candidate in (p, real or p):
            if not any(_inside(candidate, top) for top in (self.workdir, self.state_dir)):
                raise SandboxError(f"path {path!r} is outside the sandbox; use a path inside {self.workdir}")
        return real or p

    def run(self, cmd: str, timeout: float = 90, max_output: int = DEFAULT_MAX_OUTPUT) -> Result:
        """Run a shell command (bash) in workdir with the image's setup prefix applied."""
        self._check_open()
        return self._exec(["bash", "-c", self._with_setup(cmd)], timeout, max_output)

    def read(self, path: str) -> str:
        return decode(self.read_bytes(path))

    def write(self, path: str, text: str) -> None:
        self.write_bytes(path, text.encode("utf-8"))

    def run_tool(self, name: str, params: dict[str, str], timeout: float = 90) -> Result:
        """Run one DeepSWE/R2E tool; `output` is the observation exactly as the tool prints it."""
        self._check_open()
        if name not in TOOL_NAMES and name not in R2EGYM_TOOL_NAMES:
            raise SandboxError(f"unknown tool {name!r}; use one of {', '.join(TOOL_NAMES)}")
        bad = [k for k, v in params.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise SandboxError(f"tool parameters must be str -> str; fix {bad}")
        self._prepare_tools()
        blob = json.dumps(params)
        env = {"KVAGENT_TOOL_TIMEOUT": repr(float(timeout)), "KVAGENT_STATE_DIR": self.state_dir}
        script = shlex.quote(f"{self.tools_dir}/{name}.py")
        python = self.task_python if name in R2EGYM_TOOL_NAMES and self.task_python else self.tool_python
        cmd = f"{shlex.quote(python)} {script}"
        if len(blob) < PARAMS_ENV_MAX:
            env["KVAGENT_TOOL_PARAMS"] = blob  # saves a copy round trip per call
        else:  # argv/env strings are limited to 128 KiB; file_text can exceed that
            pfile = f"{self.state_dir}/params-{uuid.uuid4().hex}.json"
            self.write_bytes(pfile, blob.encode("utf-8"))
            cmd += f" --params-file {shlex.quote(pfile)}"
        return self._exec(["bash", "-c", self._with_setup(cmd)], timeout + TOOL_GRACE_S, env=env)

    def install_commands(self, scripts: Mapping[str, bytes]) -> None:
        """Put each script in `commands_dir` as an executable named by its key (R2E-Gym's tools, the
        way its runtime installs them: sandbox/commands.py), then start each with `--help`: a
        SandboxError names the first that cannot start (a module missing in the image, say)."""
        self._check_open()
        commands.check_names(scripts)
        self.link_task_venv()
        for name, data in scripts.items():
            self._put_executable(f"{self.commands_dir}/{name}", data)
        progs = {n: commands.interpreter(data) for n, data in scripts.items()}
        probe = self._exec(["sh", "-c", commands.probe_script(progs)], 60)
        fallback = set(probe.output.split())
        python = shlex.quote(self.task_python or self.tool_python)
        for name in scripts:
            path = shlex.quote(f"{self.commands_dir}/{name}")
            self._runners[name] = f"{python} {path}" if name in fallback else name
        check = self._exec_plain(
            ["sh", "-c", commands.help_script(self._runners)], 4 * 60, self._command_path()
        )
        if check.exit_code != 0:
            name, _, why = check.output.strip().partition("\n")
            raise SandboxError(
                f"the tool {name} does not start in this sandbox ({why.strip()[-200:] or 'no output'}); "
                "install what it imports in the image's /root/.venv (R2E-Gym's images have chardet) "
                "or run without --r2egym (kvagent's own r2egym tools)"
            )

    def run_command(self, cmd: str, timeout: float = 90) -> Result:
        """A shell command line run as R2E-Gym's runtime runs a tool call: `timeout T CMD` under
        /bin/sh in workdir with `PATH` alone set; the first word may name an installed command."""
        self._check_open()
        line = commands.command_line(self._runners, cmd, timeout)
        return self._exec_plain(["/bin/sh", "-c", line], timeout + TOOL_GRACE_S, self._command_path())

    def _command_path(self) -> str:
        return commands.R2EGYM_PATH

    def link_task_venv(self) -> None:  # noqa: B027 - only a container has a task env to link
        """R2E-Gym's step on SWE-bench images: the testbed's conda env linked to /root/.venv, where its
        tools' `#!` points (and `task_python` then is); nothing where there is no such env."""

    def diff(self) -> str:
        """Patch of the working tree against the base commit (new files included, binaries left out)."""
        self._check_open()
        with self._scratch() as scratch:
            out = f"{scratch}/diff.patch"  # overwritten each call
            r = self._exec(["bash", "-c", gitdiff.diff_script(self.base_commit, out)], 300, 64 * 1024)
            if r.exit_code != 0:
                raise SandboxError(f"git diff failed in the sandbox: {r.output.strip()[-300:]}")
            data = self.read_bytes(out)
            undecodable = gitdiff.undecodable_paths(data)
            if undecodable:  # their sections as git binary patches (ASCII), so the patch applies
                attrs = f"{scratch}/binary.attributes"
                self.write_bytes(attrs, gitdiff.binary_attributes(undecodable).encode("utf-8"))
                script = gitdiff.diff_script(self.base_commit, out, attrs, tuple(undecodable))
                r = self._exec(["bash", "-c", script], 300, 64 * 1024)
                if r.exit_code != 0:
                    raise SandboxError(f"git diff failed in the sandbox: {r.output.strip()[-300:]}")
                data = gitdiff.splice(data, self.read_bytes(out))
            return gitdiff.drop_binary(decode(data))

    def r2egym_diff(self, timeout: float = 120) -> Result:
        """R2E-Gym's end-of-episode patch command, run as its runtime runs it (`get_patch`: `timeout T
        git add -A && git diff --cached` under /bin/sh in workdir, `PATH` alone set, git's own
        defaults: renames detected, output raw) on a copy of the index, so the tree's `git status` stays
        as the model left it. The output (stdout and stderr) is read from a file, uncapped; the agent
        applies R2E-Gym's rules to it (agent/r2egym.py, `output_patch`)."""
        self._check_open()
        with self._scratch() as scratch:
            out, index = (shlex.quote(f"{scratch}/r2egym.{ext}") for ext in ("patch", "index"))
            git = "git -c safe.directory='*'"  # the copy may belong to another uid; output unchanged
            line = (
                f'real="$({git} rev-parse --git-path index)"; rm -f {index}; '
                f'[ ! -f "$real" ] || cp -p "$real" {index}; export GIT_INDEX_FILE={index}; '
                f"{{ timeout {timeout:g} {git} add -A && {git} diff --cached; }} > {out} 2>&1; "
                f"rc=$?; rm -f {index}; exit $rc"
            )
            r = self._exec_plain(["/bin/sh", "-c", line], timeout + TOOL_GRACE_S, self._command_path())
            try:
                text = decode(self.read_bytes(f"{scratch}/r2egym.patch"))
            except FileNotFoundError:
                text = r.output
        return Result(r.exit_code, text, r.timed_out)

    def _prepare_tools(self) -> None:  # noqa: B027 - a container copies kvagent's tools in lazily
        """Make kvagent's tool scripts and state dir available (before the first `run_tool`)."""

    @contextlib.contextmanager
    def _scratch(self) -> Iterator[str]:
        """A directory for kvagent's own files of one operation (the state dir here)."""
        yield self.state_dir

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # last resort; close() is the contract
        try:
            if not getattr(self, "_closed", True):
                self.close()
        except Exception:
            pass

    # --- helpers for backends -----------------------------------------------------------------
    def _with_setup(self, cmd: str) -> str:
        return f"{self.setup}\n{cmd}" if self.setup else cmd

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("the sandbox is closed; open a new one with open_sandbox()")

    def _init_repo_state(self) -> None:
        """Record the base commit, committing a snapshot first if workdir is not a git repository."""
        r = self._exec(["bash", "-c", gitdiff.init_script()], 300, 64 * 1024)
        sha = r.output.strip().splitlines()[-1] if r.output.strip() else ""
        if r.exit_code != 0 or len(sha) < 40:
            raise SandboxError(f"could not prepare git state in {self.workdir}: {r.output.strip()[-300:]}")
        self.base_commit = sha
