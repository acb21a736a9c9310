#!/usr/bin/env python3
"""execute_bash (r2egym profile): run `--cmd` with /bin/sh and print `[STDOUT]` / `[STDERR]`
sections, as R2E-Gym's r2egym execute_bash does.

Stdlib only (plus _r2e.py beside it), python >= 3.6 (R2E images' task interpreter). A command
whose first word is git, ipython, jupyter or nohup is refused (exit 1). A failing command's output is headed `Error executing command:`
and the tool exits with its status. After $KVAGENT_TOOL_TIMEOUT seconds the command's process group
is killed and the tool exits 124, which the agent reports as R2E-Gym's timeout.
"""

import argparse
import contextlib
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _r2e import argv, emit  # noqa: E402

BLOCKED = ("git", "ipython", "jupyter", "nohup")
TIMEOUT_EXIT = 124


def main():
    parser = argparse.ArgumentParser(prog="execute_bash", description="Execute a bash command.")
    parser.add_argument("--cmd", required=True)
    args = parser.parse_args(argv())
    first = args.cmd.strip().split()[0]  # an empty command fails here, with a traceback, as in R2E-Gym
    if first in BLOCKED:
        emit(f"Bash command '{first}' is not allowed. Please use a different command or tool.\n")
        return 1
    try:
        timeout = float(os.environ.get("KVAGENT_TOOL_TIMEOUT") or 90)
    except ValueError:
        timeout = 90.0
    proc = subprocess.Popen(
        args.cmd,
        shell=True,  # /bin/sh, as subprocess.run(shell=True) in R2E-Gym
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        universal_newlines=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return TIMEOUT_EXIT
    body = f"[STDOUT]\n\n{out.strip()} \n\n[STDERR]\n\n{err.strip()}\n"
    if proc.returncode != 0:
        emit("Error executing command:\n\n" + body)
        return proc.returncode
    emit(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
