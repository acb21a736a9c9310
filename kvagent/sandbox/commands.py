"""Someone else's tool scripts as commands on the sandbox's PATH, run the way their own runtime runs
them: R2E-Gym's (`--r2egym PATH`) copies each tool into `/usr/local/bin` under its name without
`.py`, made executable, and runs a call as `/bin/sh -c "timeout T NAME ARGS"` in the working tree
with `PATH` its only variable. The sandbox does the same, so the tools' behaviour is theirs by
construction, and the model can call them from its own shell commands too.

A script starts through its `#!` line (R2E-Gym's: `/root/.venv/bin/python`, the task's interpreter).
Where the sandbox has no such interpreter (a local sandbox; an image without `/root/.venv`) the call
runs it with the sandbox's interpreter instead, named on the command line; the model's own shell
calls of it then fail as they would in such an image."""

from __future__ import annotations

import shlex
from collections.abc import Mapping

# Where R2E-Gym's runtime puts its tools, and the one variable it sets on every command.
COMMANDS_DIR = "/usr/local/bin"
R2EGYM_PATH = (
    "/root/.venv/bin:/root/.local/bin:/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:"
    "/usr/bin:/sbin:/bin"
)
# SWE-bench images keep the task env in conda; R2E-Gym links it where its tools' `#!` points.
LINK_TASK_VENV = (
    "[ -e /root/.venv ] || [ ! -d /opt/miniconda3/envs/testbed ] || "
    "ln -s /opt/miniconda3/envs/testbed /root/.venv"
)
HELP_TIMEOUT_S = 60


def check_names(scripts: Mapping[str, bytes]) -> None:
    from kvagent.sandbox.errors import SandboxError

    bad = [n for n in scripts if not n or "/" in n or n != shlex.quote(n) or n.startswith("-")]
    if bad:
        raise SandboxError(f"command name {bad[0]!r} is not a plain file name; name the script file so")


def interpreter(script: bytes) -> str | None:
    """The program of a script's `#!` line (its first word), or None without one."""
    first = script.split(b"\n", 1)[0]
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    return words[0] if words else None


def probe_script(interpreters: Mapping[str, str | None]) -> str:
    """Prints the names whose `#!` interpreter the sandbox cannot run, one a line."""
    lines = [
        f"[ -x {shlex.quote(prog)} ] || echo {shlex.quote(name)}" if prog else f"echo {shlex.quote(name)}"
        for name, prog in interpreters.items()
    ]
    return "\n".join(lines) or "true"


def help_script(runners: Mapping[str, str]) -> str:
    """Runs `NAME --help` for every command (argparse prints its usage; an import error fails it) and,
    for the first that fails, prints its name and its last line of output, then exits 1."""
    parts = []
    for name, runner in runners.items():
        q = shlex.quote(name)
        parts.append(
            f"out=$(timeout {HELP_TIMEOUT_S} {runner} --help 2>&1) || "
            f'{{ echo {q}; printf "%s\\n" "$out" | tail -n 1; exit 1; }}'
        )
    return "\n".join(parts) or "true"


def command_line(runners: Mapping[str, str], cmd: str, timeout: float) -> str:
    """`timeout T CMD ` as R2E-Gym's runtime writes it (its empty `args` leave a trailing space, which
    a model's `ps` shows), the first word of CMD swapped for how that command runs here (an
    installed command without its interpreter runs through the sandbox's)."""
    first, sep, rest = cmd.partition(" ")
    return f"timeout {timeout:g} {runners.get(first, first)}{sep}{rest} "
