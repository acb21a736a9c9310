"""What a long benchmark reports its progress to: `task(description, total)` gives a handle with
`advance(n)` and `done()`. Commands pass live bars (`kvagent.cli.ui.Bars`); by default nothing is
shown."""

from __future__ import annotations


class _NoTask:
    def advance(self, n: float = 1) -> None:
        pass

    def done(self) -> None:
        pass


class NoProgress:
    def task(self, description: str, total: float) -> _NoTask:
        return _NoTask()
