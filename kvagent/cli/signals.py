"""SIGTERM (what `kill`, schedulers and CI send) and SIGHUP (a closed terminal) stop kvagent the
way Ctrl-C does: as KeyboardInterrupt in the main thread, so `with` blocks close their sandboxes
and containers, partial results are kept, and the exit status is 130. Installed once, by main()."""

from __future__ import annotations

import signal
import threading

from kvagent.errors import Terminated

STOPS = (signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum: int, _frame) -> None:
    raise Terminated(signal.Signals(signum).name)


def install() -> None:
    """Route SIGTERM and SIGHUP to KeyboardInterrupt; a signal the caller ignores (`nohup`) stays
    ignored, and outside the main thread (embedded use) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in STOPS:
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _interrupt)
