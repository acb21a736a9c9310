"""Rich progress bars for long benchmark runs, or nothing at all (tests, --quiet)."""

from __future__ import annotations

import sys


class _Task:
    def __init__(self, progress, task_id) -> None:
        self._p, self._id = progress, task_id

    def advance(self, n: float = 1) -> None:
        if self._p is not None:
            self._p.advance(self._id, n)

    def done(self) -> None:
        if self._p is not None:
            self._p.remove_task(self._id)


class Progress:
    def __init__(self, enabled: bool = True) -> None:
        self._p = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._p = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=sys.stderr),
                transient=True,
            )

    def __enter__(self) -> Progress:
        if self._p is not None:
            self._p.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._p is not None:
            self._p.stop()

    def task(self, description: str, total: float) -> _Task:
        if self._p is None:
            return _Task(None, None)
        return _Task(self._p, self._p.add_task(description, total=total))
