"""The agent as a conversation over ONE token stream: `ChatAgent` is the loop of `loop.Agent` with
requests after the first appended as user turns, step limits counted per request, and replies that
can be stopped between tokens.

The first request becomes the instance prompt (system prompt + request); each later request follows
the last reply, so the live cache (and its evictions) spans the whole chat. A stopped reply keeps its
tokens in the stream: interrupting a forward pass half-way would leave some layers of the cache
holding a token that the others (and the history) lack, so `interrupt()` only sets a flag that
generation checks after each token. What is shown and how keys are read is the caller's (the
terminal chat of `kvagent.cli.chat.run`): text arrives through `on_text`, events through `on_event`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from kvagent.agent.loop import INTERRUPTED, Agent
from kvagent.agent.observation import FINISHED
from kvagent.agent.parser import ToolCall
from kvagent.errors import Terminated

DECLINED = (
    "The user declined to run this call; it did not run. Do not repeat it unchanged: take a different "
    "step, or call `finish` if the request is done."
)
STOPPED_BEFORE = "The user interrupted before this call ran; it did not run."
STOPPED_DURING = "The user interrupted this call while it ran; it did not finish."
STOPPED_REPLY = "The user interrupted your reply."


class ChatQuit(Exception):
    """The user chose to quit (e.g. q at an approval prompt); raised by the caller's `approve`."""


@dataclass
class _Stopped:
    ids: list[int]
    text: str
    finish_reason: str


@dataclass
class ChatAgent(Agent):
    # Reply text as it is sampled (whole characters only).
    on_text: Callable[[str], None] | None = None
    # Entered around each tool call, e.g. to let Ctrl-C raise KeyboardInterrupt there.
    guard_tool: Callable[[], AbstractContextManager[Any]] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.requests = 0
        self.error: str | None = None
        self.stop_requested = False
        self.tool_running = False
        self._unshown: list[int] = []  # ids whose text is an incomplete UTF-8 character so far

    @property
    def request_steps(self) -> int:
        """Model calls made for the current request."""
        return len(self.turns) - self.first_step

    def interrupt(self) -> None:
        """End the current reply after the next token (what Ctrl-C does while the model runs)."""
        self.stop_requested = True

    def ask(self, request: str) -> str:
        """Run the agent on one request until it calls finish (or a limit, an interruption, a quit);
        returns the status: submitted | step_limit | context_limit | interrupted | quit | error."""
        self.stop_requested = self.tool_running = False
        self.requests += 1
        try:
            status = self.start(request) if not self.messages else self.follow_up(self._with_notes(request))
            if status is None:
                status = self.loop()
        except Terminated:  # SIGTERM / SIGHUP: the whole chat ends, not just this request
            raise
        except KeyboardInterrupt:  # raised only by the caller's approval prompt or tool guard
            status = INTERRUPTED
            turn = self.turns[-1] if self.turns else None
            if turn is not None and turn.observation is None:
                turn.observation = STOPPED_DURING if self.tool_running else STOPPED_BEFORE
        except ChatQuit:
            status = "quit"
        except Exception as e:  # the stream may be inconsistent now: the chat ends, the patch stays
            status, self.error = "error", f"{type(e).__name__}: {e}"
        return status

    def _with_notes(self, request: str) -> str:
        """What the model missed since its last reply (an unfed observation, an interruption)."""
        last = self.turns[-1] if self.turns else None
        note = None
        if last is not None and not last.fed:
            if last.observation and last.observation != FINISHED:
                note = last.observation
            elif last.finish_reason == INTERRUPTED:
                note = STOPPED_REPLY
        return f"{note}\n\n{request}" if note else request

    # ----------------------------------------------------------------- hooks of the loop
    def _generate(self, max_new_tokens: int) -> Any:
        if self.stop_requested:  # stopped before the reply began
            return _Stopped([], "", INTERRUPTED)
        self._unshown = []
        g = self.session.generate(
            max_new_tokens,
            sampling=self.config.sampling(),
            stop=list(self.scaffold.stop),
            on_token=self._token,
        )
        if self._unshown and self.on_text is not None:
            self.on_text(self.render.decode(self._unshown))
        return g

    def _token(self, token: int) -> bool:
        if self.on_text is not None:
            self._unshown.append(int(token))
            piece = self.render.decode(self._unshown)
            if not piece.endswith("\ufffd"):
                self.on_text(piece)
                self._unshown = []
        return self.stop_requested

    def _run_tool(self, call: ToolCall) -> Any:
        with self.guard_tool() if self.guard_tool is not None else contextlib.nullcontext():
            if self.stop_requested:  # stopped between the reply and the call: it does not start
                raise KeyboardInterrupt
            # Stays True if the call is interrupted, so `ask` can say the call did not finish.
            self.tool_running = True
            result = super()._run_tool(call)
            self.tool_running = False
            return result
