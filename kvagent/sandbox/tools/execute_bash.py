#!/usr/bin/env python3
"""execute_bash: run one shell command in the repository and report its exit code and output.

Stdlib only (plus _toolkit.py beside it), python >= 3.7. Parameters: `cmd` (via
--params-file FILE or --cmd X).
Interactive or never-ending programs are refused (there is no terminal). The command is killed,
with its whole process group, after $KVAGENT_TOOL_TIMEOUT seconds (default 90).
"""

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # even under PYTHONSAFEPATH / -P
from _toolkit import ERRORS, emit, fail, load_params  # noqa: E402

MAX_STREAM_BYTES = 100000  # per stream; the rest is read and dropped
DEFAULT_TIMEOUT = 90.0
# Programs that wait for a terminal or never exit on their own.
INTERACTIVE = {
    "vim", "vi", "nvim", "nano", "emacs", "pico", "ed", "less", "more", "most", "top", "htop",
    "watch", "man", "tmux", "screen", "ssh", "telnet", "ftp", "sftp", "gdb", "pdb", "ipython",
    "jupyter",
}  # fmt: skip
REPLS = {"python", "python2", "python3", "bash", "sh", "zsh", "node", "irb", "sqlite3", "mysql", "psql"}


def refusal(cmd):
    """Why cmd cannot run here, or None. Checks the program of every simple command."""
    for part in re.split(r"&&|\|\||[;|&\n]", cmd):
        try:
            words = shlex.split(part)
        except ValueError:
            words = part.split()
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):  # VAR=value prefixes
            words.pop(0)
        while words and words[0] in ("sudo", "env", "nohup", "time", "exec"):
            words.pop(0)
        if not words:
            continue
        prog = os.path.basename(words[0])
        if prog in INTERACTIVE or (
            prog == "tail" and ("-f" in words or "-F" in words or "--follow" in words)
        ):
            return "`{}` is interactive or never exits".format(
                " ".join(words[:2] if prog == "tail" else words[:1])
            )
        if (prog in REPLS or re.match(r"^python[0-9.]*$", prog)) and len(words) == 1:
            return f"`{prog}` without arguments starts an interactive session"
    return None


class Capped(threading.Thread):
    def __init__(self, pipe):
        threading.Thread.__init__(self, daemon=True)
        self.pipe, self.data, self.dropped = pipe, bytearray(), 0
        self.start()

    def run(self):
        while True:
            chunk = self.pipe.read(65536) if not hasattr(self.pipe, "read1") else self.pipe.read1(65536)
            if not chunk:
                return
            room = MAX_STREAM_BYTES - len(self.data)
            if room > 0:
                self.data += chunk[:room]
            self.dropped += max(0, len(chunk) - max(room, 0))

    def text(self):
        text = bytes(self.data).decode("utf-8", "replace")
        if self.dropped:
            text += f"\n[... {self.dropped} more bytes not shown ...]"
        return text


def main():
    try:
        params = load_params(sys.argv[1:])
    except ERRORS as e:
        return fail(e)
    cmd = str(params.get("cmd", params.get("command", ""))).strip()
    if not cmd:
        return fail("the cmd parameter is required (the shell command to run)")
    why = refusal(cmd)
    if why:
        emit(
            f"ERROR: {why}; there is no terminal here. Use non-interactive commands instead "
            "(file_editor to view or edit files, `python script.py`, `cat`/`head`/`grep`).\n"
        )
        return 2
    try:
        timeout = float(os.environ.get("KVAGENT_TOOL_TIMEOUT") or DEFAULT_TIMEOUT)
    except ValueError:
        timeout = DEFAULT_TIMEOUT
    proc = subprocess.Popen(
        ["bash", "-c", cmd],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # own process group: a timeout kills the command's children too
    )
    out, err = Capped(proc.stdout), Capped(proc.stderr)
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    if timed_out:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # Background children may keep the pipes open; do not wait for them for long.
    out.join(2.0)
    err.join(2.0)
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)  # leftovers of a finished command die with it
    code = proc.returncode if not timed_out else 124
    if code < 0:
        code = 128 - code
    stdout, stderr = out.text().rstrip("\n"), err.text().rstrip("\n")
    text = f"Exit code: {code}\nExecution output of [execute_bash]:\n[STDOUT]\n\n{stdout}\n\n[STDERR]\n\n{stderr}"
    if timed_out:
        text += f"\nERROR: the command timed out after {timeout:g} seconds and was killed; run long jobs with a smaller input or in the background\n"
    emit(text if text.endswith("\n") else text + "\n")
    return min(code, 255)


if __name__ == "__main__":
    sys.exit(main())
