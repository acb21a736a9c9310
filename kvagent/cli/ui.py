"""Terminal display shared by the commands: an episode's cache status line, its live output (replies
streamed as they are sampled, a status line per step), and progress bars for long benchmark runs."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console
from rich.text import Text


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def cache_status(stats: Any, config: Any) -> str:
    """`tokens 9,000 | cache 1,280/1,024+256 | rounds 12 | evicted 34,560 | KV 12.3 MB` from a
    CacheStats; the cap is the trigger of the session's CacheConfig (K + 2r under recent-buffer,
    K + r under topk-all; `dense` for a cache that never evicts, or with no config)."""
    if stats is None:
        return "cache -"
    from kvagent.runtime.schedule import Schedule

    entries = max(stats.entries) if stats.entries else 0
    evicts = config is not None and config.evicts
    cap = f"{config.budget}+{Schedule(config, None, 1).beyond_k}" if evicts else "dense"
    return (
        f"tokens {stats.logical_length:,} | cache {entries:,}/{cap} | rounds {stats.rounds} | "
        f"evicted {stats.evicted:,} | KV {human_bytes(stats.total_kv_bytes)}"
    )


def print_markdown(text: str, console: Console | None = None) -> None:
    """A report written as Markdown, shown as a person reads it: drawn (tables as tables) on a
    terminal, verbatim when piped, so `> report.md` still gets the Markdown."""
    console = console or Console()
    if console.is_terminal:
        from rich.markdown import Markdown

        console.print(Markdown(text))
    else:
        print(text, file=console.file, flush=True)


def human_seconds(s: float) -> str:
    s = max(0, round(s))
    return (
        f"{s}s"
        if s < 60
        else f"{s // 60}m{s % 60:02d}s"
        if s < 3600
        else f"{s // 3600}h{s % 3600 // 60:02d}m"
    )


def trim_lines(text: str, shown: int) -> str:
    """At most `shown` lines: the head and the tail, with a marker for what is cut in between."""
    lines = text.split("\n")
    if len(lines) <= shown:
        return text
    cut = len(lines) - shown
    return "\n".join([*lines[: shown // 2], f"[... {cut} lines ...]", *lines[len(lines) - shown // 2 :]])


class EpisodeStream:
    """Live output of one episode at a time as plain scrolling lines (no Live region, so it survives
    Ctrl-C and long replies): a header per step, the reply as it is sampled, one status line when the
    reply ends (step i/N, tokens, cache entries / K+r, rounds, evicted, elapsed), then the observation.

    Hook-up: `engine = stream.wrap(engine)` streams every session the engine opens (its CacheConfig
    gives the cap), and `on_event=stream` adds tool-call errors, observations and the final status.
    One episode at a time: with parallel episodes the lines would interleave."""

    def __init__(self, console: Console, max_steps: int, *, observation_lines: int = 20) -> None:
        self.console, self.max_steps, self.observation_lines = console, max_steps, observation_lines
        self.config: Any = None  # the session's CacheConfig
        self.step = 0
        self.started = time.perf_counter()
        self._reply_started = self.started
        self._decode: Any = None
        self._unshown: list[int] = []
        self._mid_line = False

    def wrap(self, engine: Any) -> Any:
        return _StreamingEngine(engine, self)

    def announce(self, title: str) -> None:
        """A heading before an episode (eval: the run id), so the steps that follow have an owner."""
        self._line("")
        self.console.rule(Text(title, style="bold"), align="left", style="bold")

    def around_runs(self, on_update: Any, summary: Any = None) -> Any:
        """An eval runner's `on_update(event, run, record)` for one run at a time: `on_update` as
        before, a heading per run as it starts, and `summary()` (e.g. the table) after each that ran."""

        def update(event: str, run: Any, record: Any) -> None:
            on_update(event, run, record)
            if event == "start":
                self.announce(run.run_id)
            elif event == "done" and summary is not None and not (record or {}).get("derived_from"):
                self._line("")
                self.console.print(summary())

        return update

    # ------------------------------------------------------------- from the session (one per episode)
    def opened(self, config: Any, tokenizer: Any) -> None:
        self.config = config
        self.step, self.started = 0, time.perf_counter()
        self._decode = lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)

    def fed(self, n_tokens: int, stats: Any, first: bool) -> None:
        if first:
            self._line(f"prompt {n_tokens:,} tokens | {self._status(stats)}", "dim cyan")

    def reply_started(self) -> None:
        self.step += 1
        self._reply_started = time.perf_counter()
        self._unshown = []
        self.console.rule(f"step {self.step}/{self.max_steps}", align="left", style="cyan")

    def token(self, token: int) -> None:
        self._unshown.append(int(token))
        piece = self._decode(self._unshown)
        if not piece.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            self._text(piece)
            self._unshown = []

    def reply_done(self, n_tokens: int, finish_reason: str, stats: Any) -> None:
        if self._unshown:
            self._text(self._decode(self._unshown))
        took = time.perf_counter() - self._reply_started
        tail = "" if finish_reason in ("stop", "eos") else f" ({finish_reason})"
        self._line(f"step {self.step}/{self.max_steps} | {self._status(stats)} | "
                   f"reply {n_tokens:,} tokens in {took:.1f}s{tail}", "cyan")  # fmt: skip

    # ------------------------------------------------------------- agent events
    def __call__(self, event: Any) -> None:
        turn = getattr(event, "turn", None)
        if event.kind == "reply" and turn is not None and turn.call_error:
            self._line(f"(no valid call: {turn.call_error})", "yellow")
        elif event.kind == "observation" and turn is not None:
            self._line(trim_lines(turn.observation or "", self.observation_lines), "dim")
        elif event.kind == "end":
            self._line(
                f"end: {event.exit_status} after {event.step} steps | {self._status(event.stats)}", "bold"
            )

    def _status(self, stats: Any) -> str:
        return f"{cache_status(stats, self.config)} | elapsed {human_seconds(time.perf_counter() - self.started)}"

    def _text(self, text: str) -> None:
        self.console.print(Text(text), end="", soft_wrap=True)
        self._mid_line = not text.endswith("\n")

    def _line(self, text: str, style: str = "") -> None:
        if self._mid_line:  # a reply cut short (Ctrl-C, an error) left its line open
            self.console.print()
        self._mid_line = False
        self.console.print(Text(text, style=style), soft_wrap=True)


class _StreamingEngine:
    """An engine whose sessions report to an EpisodeStream; everything else is the wrapped engine."""

    def __init__(self, engine: Any, stream: EpisodeStream) -> None:
        self._engine, self._stream = engine, stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def session(self, config: Any) -> Any:
        self._stream.opened(config, self._engine.tokenizer)
        return _StreamingSession(self._engine.session(config), self._stream)


class _StreamingSession:
    def __init__(self, session: Any, stream: EpisodeStream) -> None:
        self._session, self._stream = session, stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def append(self, ids: Any) -> Any:
        first = self._session.logical_length == 0
        out = self._session.append(ids)
        self._stream.fed(len(ids), self._session.stats, first)
        return out

    def generate(self, max_new_tokens: int, *args: Any, on_token: Any = None, **kwargs: Any) -> Any:
        stream = self._stream

        def token(t: int) -> Any:
            stream.token(t)
            return on_token(t) if on_token is not None else None

        stream.reply_started()
        g = self._session.generate(max_new_tokens, *args, on_token=token, **kwargs)
        stream.reply_done(len(g.ids), g.finish_reason, self._session.stats)
        return g


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
