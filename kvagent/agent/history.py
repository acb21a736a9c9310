"""History strategies: how past turns stay in the one live cache.

A history setting is a reply rule (`keep-thinking`, `drop-thinking`, `r2egym`: thinking.py, loop.py)
optionally joined by `+` with observation masking (The Complexity Trap, arXiv 2508.21433: keep the
newest M observations whole, older ones leave the context; M = 10, the paper's setting):
`mask-observations` (M = 10), `mask-observations=M`, `drop-thinking+mask-observations=5`.

An observation is a tool output as the scaffold shows it (kvagent's tool results, R2E-Gym's user
turns with tool output); the issue and chat requests are not. Persistent mode: a masked observation's
content tokens are forgotten (`Session.forget`): evicted from every layer and head, nothing put in
their place, because no token can be inserted into the middle of a live cache. Reprefill mode: the
paper's (and SWE-agent's `LastNObservations`') method: the history re-sent from then on holds the
observation's content re-rendered as one line, `PLACEHOLDER` with its line count."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvagent.errors import ConfigError

REPLY_RULES = ("keep-thinking", "drop-thinking", "r2egym")
MASK = "mask-observations"
DEFAULT_KEEP = 10  # M of The Complexity Trap (its best setting for SWE-agent on SWE-bench Verified)
# What a masked observation's content becomes in reprefill mode (SWE-agent's template): the count is
# `len(text.splitlines())`.
PLACEHOLDER = "Old environment output: ({n} lines omitted)"


@dataclass(frozen=True)
class History:
    reply: str  # keep-thinking | drop-thinking | r2egym
    keep: int | None  # M: observations kept whole (None: no masking)

    @property
    def masks(self) -> bool:
        return self.keep is not None

    def spell(self) -> str:
        if self.keep is None:
            return self.reply
        mask = MASK if self.keep == DEFAULT_KEEP else f"{MASK}={self.keep}"
        return mask if self.reply == "keep-thinking" else f"{self.reply}+{mask}"


def parse_history(text: str) -> History:
    """`drop-thinking+mask-observations=5` -> History("drop-thinking", 5); one line on a bad value."""
    choices = f"{', '.join(REPLY_RULES)}, {MASK}[=M], or RULE+{MASK}[=M]"
    reply, keep = None, None
    for part in str(text).split("+"):
        name, eq, value = part.strip().partition("=")
        if name == MASK and keep is None:
            if not eq:
                keep = DEFAULT_KEEP
                continue
            try:
                keep = int(value)
            except ValueError:
                keep = 0
            if keep < 1:
                raise ConfigError(f"history: {MASK}=M needs M >= 1 observations kept, got {value!r}")
        elif name in REPLY_RULES and reply is None and not eq:
            reply = name
        else:
            raise ConfigError(f"history: got {text!r}; choose {choices}")
    return History(reply or "keep-thinking", keep)


def placeholder(text: str) -> str:
    """The one line a masked observation becomes in reprefill mode."""
    return PLACEHOLDER.format(n=len(text.splitlines()))


def newly_masked(count: int, keep: int, masked: int) -> range:
    """Indices of observations to mask before the observation numbered `count` (0-based) is fed, so
    that with it the newest `keep` stay whole; `masked` are masked already (oldest first)."""
    return range(masked, max(masked, count + 1 - keep))


def content_span(with_text: Sequence[int], without: Sequence[int]) -> tuple[int, int]:
    """(start, end) of the content's tokens in a rendered turn: the turn rendered with the content
    (`with_text`) against the same turn with none (`without`), less their common head and tail. The
    framing (role, turn markers) stays outside, so forgetting the span never breaks the chat format."""
    head = 0
    while head < min(len(with_text), len(without)) and with_text[head] == without[head]:
        head += 1
    tail = 0
    while (
        tail < min(len(with_text), len(without)) - head
        and with_text[len(with_text) - 1 - tail] == without[len(without) - 1 - tail]
    ):
        tail += 1
    return head, len(with_text) - tail


class ObservationMask:
    """Observation masking on one session: the stream span of each observation's content, oldest
    first, and how many are masked. `track` after an observation is fed; `mask_before_next` before the
    next one is, so the reply that follows it reads the newest `keep` observations whole."""

    def __init__(self, keep: int, render) -> None:
        self.keep, self.render = keep, render
        self.spans: list[list] = []  # [start, end, text] per observation, stream positions
        self.masked = 0

    def track(self, session, text: str, fed: list[int]) -> None:
        """`fed` was just appended and ends with the user turn of observation `text`."""
        tail = self.render.user_turn_ids(text)
        if list(fed[len(fed) - len(tail) :]) != list(tail):  # another framing: left whole, never guessed
            return
        a, b = content_span(tail, self.render.user_turn_ids(""))
        start = session.logical_length - len(tail)
        self.spans.append([start + a, start + b, text])

    def mask_before_next(self, session) -> tuple[int, int]:
        """Mask what the next observation pushes out of the newest `keep`. Returns (tokens forgotten
        with positions kept (persistent), tokens by which the stream shrank (reprefill re-render))."""
        forgotten = shrunk = 0
        for i in newly_masked(len(self.spans), self.keep, self.masked):
            start, end, text = self.spans[i]
            if session.config.mode == "persistent":
                forgotten += session.forget(list(range(start, end)))
            else:
                shrunk += self._rerender(session, i)
            self.masked = i + 1
        return forgotten, shrunk

    def _rerender(self, session, i: int) -> int:
        """Reprefill: the history from observation i on, taken back (`rewind`) and appended again with
        its content as the placeholder line; the next append re-prefills it. Later spans shift."""
        start, end, text = self.spans[i]
        line = self.render.user_turn_ids(placeholder(text))
        a, b = content_span(line, self.render.user_turn_ids(""))
        rest = [*line[a:b], *session.history[end:]]
        delta = (end - start) - (b - a)
        # The rewind drops the segment marks past `start`; the re-sent tokens keep theirs, shifted.
        later = [m - delta for m in getattr(session, "segment_starts", ()) if m >= end]
        session.rewind(session.logical_length - start)
        for m in later:
            session.mark_segment(m)
        session.append(rest)
        for span in self.spans[i + 1 :]:
            span[0] -= delta
            span[1] -= delta
        self.spans[i][1] = start + (b - a)
        return delta
