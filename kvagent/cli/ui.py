"""Terminal display shared by the commands: a one-line live status of an episode's cache, and
progress bars for long benchmark runs."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def cache_status(stats: Any, budget: Any, buffer: int) -> str:
    """`cache 1,024/1,152 | rounds 12 | evicted 34,560 | KV 12.3 MB` from a CacheStats."""
    if stats is None:
        return "cache -"
    entries = max(stats.entries) if stats.entries else 0
    cap = "dense" if budget is None else f"{budget}+{buffer}"
    return (
        f"tokens {stats.logical_length:,} | cache {entries:,}/{cap} | rounds {stats.rounds} | "
        f"evicted {stats.evicted:,} | KV {human_bytes(stats.total_kv_bytes)}"
    )


class EpisodeProgress:
    """Callback for agent events that keeps one live status line (step, tokens, cache, evictions)."""

    def __init__(self, console: Console, budget: Any, buffer: int, max_steps: int) -> None:
        self.console = console
        self.budget, self.buffer, self.max_steps = budget, buffer, max_steps
        self.live = Live(Text("starting..."), console=console, refresh_per_second=4, transient=False)
        self.last_tool = "-"

    def __enter__(self) -> EpisodeProgress:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.live.__exit__(*exc)

    def __call__(self, event: Any) -> None:
        turn = getattr(event, "turn", None)
        if turn is not None and getattr(turn, "call", None):
            self.last_tool = turn.call["name"]
        elif turn is not None and getattr(turn, "call_error", None):
            self.last_tool = "(no valid call)"
        line = (
            f"step {event.step}/{self.max_steps} | "
            f"{cache_status(event.stats, self.budget, self.buffer)} | last {self.last_tool}"
        )
        if event.kind == "end":
            line += f" | {event.exit_status}"
        self.live.update(Text(line))


class _Bar:
    def __init__(self, progress: Any, task_id: Any) -> None:
        self._p, self._id = progress, task_id

    def advance(self, n: float = 1) -> None:
        self._p.advance(self._id, n)

    def done(self) -> None:
        self._p.remove_task(self._id)


class Bars:
    """Rich progress bars on stderr (a `kvagent.bench.progress` target), or none when not `enabled`."""

    def __init__(self, enabled: bool = True) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from kvagent.bench.progress import NoProgress

        self._none = None if enabled else NoProgress()
        self._p = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(file=sys.stderr),
            transient=True,
        )

    def __enter__(self) -> Bars:
        if self._none is None:
            self._p.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._none is None:
            self._p.stop()

    def task(self, description: str, total: float) -> Any:
        if self._none is not None:
            return self._none.task(description, total)
        return _Bar(self._p, self._p.add_task(description, total=total))
