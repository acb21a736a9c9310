"""Find and kill every process a sandbox started, also those that left its process group.

Without bwrap's PID namespace (isolation="none"), `setsid cmd &` or a double-forking daemon leaves
the command's process group, so killing the group misses it. Each command's environment carries a
marker naming its sandbox; processes inherit it across setsid and forks, so a scan of /proc finds
them. A process that clears its environment on purpose still escapes: this is a backstop, not
isolation.
"""

from __future__ import annotations

import contextlib
import os
import signal

MARKER = "KVAGENT_SANDBOX"


def marked(value: str) -> list[int]:
    """Pids (not this process) whose environment holds MARKER=value; Linux /proc, else none."""
    needle = f"{MARKER}={value}".encode()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone meanwhile, or another user's
            continue
        if needle in env.split(b"\0"):
            found.append(int(name))
    return found


def kill_marked(value: str, rounds: int = 3) -> int:
    """SIGKILL every process marked with `value`; a few rounds, since one may fork while we scan.
    Returns how many were signalled."""
    killed = 0
    for _ in range(rounds):
        pids = marked(value)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed
