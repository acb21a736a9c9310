"""`kvagent chat`: the terminal around a `ChatAgent`. Requests and chat commands are read from the
user, replies stream to the console, each tool call may wait for a key, and the agent works on a
sandboxed copy of the repository; the user's checkout is never edited.

Ctrl-C stops the current reply or tool call, not the chat: while the model runs, SIGINT only asks the
agent to stop after the next token; at an approval prompt or inside a tool call it raises."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from kvagent.agent.chat import DECLINED, ChatAgent, ChatQuit
from kvagent.agent.config import AgentConfig
from kvagent.agent.loop import INTERRUPTED, AgentEvent, Turn
from kvagent.agent.parser import ToolCall
from kvagent.agent.tools import FINISH_TOOL
from kvagent.cli.settings import AgentOptions, CacheOptions, EngineOptions
from kvagent.cli.ui import cache_status, trim_lines
from kvagent.errors import ConfigError, KvagentError, Terminated

APPROVALS = ("confirm", "yolo")
SHOWN_LINES = 20  # observation lines echoed to the terminal (the model gets the full text)
HELP = """Type a request for the agent. Commands:
  /diff        show the patch of the agent's changes so far
  /save FILE   write that patch to FILE
  /stats       cache and token statistics
  /help        this text
  /quit        leave (Ctrl-D too)
Ctrl-C stops the current reply or tool call and returns to the prompt."""


def read_key(prompt: str) -> str:
    """One keypress from the terminal (a line when stdin is not a terminal); EOFError at end of input."""
    sys.stdout.write(prompt)
    sys.stdout.flush()
    if not sys.stdin.isatty():
        line = sys.stdin.readline()
        if not line:
            raise EOFError
        return line.strip()[:1]
    import termios
    import tty

    fd = sys.stdin.fileno()
    old = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)  # keeps ISIG, so Ctrl-C still raises KeyboardInterrupt here
        data = os.read(fd, 8)
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)
    if not data or data[:1] == b"\x04":
        raise EOFError
    key = data[:1].decode("ascii", errors="replace")
    sys.stdout.write(key + "\n")
    sys.stdout.flush()
    return key


class ChatSession:
    """One interactive chat over one live session and one sandbox.

    `read_line(prompt)` reads a request, `read_key(prompt)` one approval key; both raise EOFError at the
    end of input and may raise KeyboardInterrupt. `console` receives everything shown."""

    def __init__(
        self,
        session: Any,
        env: Any,
        tokenizer: Any,
        config: AgentConfig | None = None,
        *,
        approval: str = "confirm",
        console: Console | None = None,
        read_line: Callable[[str], str] | None = None,
        read_key: Callable[[str], str] = read_key,
        cache: Any = None,
        handle_sigint: bool = True,
    ) -> None:
        if approval not in APPROVALS:
            raise ConfigError(f"approval: got {approval!r}; choose one of {', '.join(APPROVALS)}")
        self.session, self.env, self.approval = session, env, approval
        self.console = console or Console()
        self.read_line = read_line or input
        self.read_key = read_key
        self.cache = cache  # the session's CacheConfig, for its status line (None: dense)
        self.handle_sigint = handle_sigint
        self.closed: str | None = None  # why no further request can be taken
        self._streamed = False
        self.agent = ChatAgent(
            session,
            env,
            tokenizer,
            config or AgentConfig(),
            on_event=self._on_event,
            approve=self._approve,
            on_text=self._show_text,
            guard_tool=lambda: self._sigint(raising=True),
        )

    @property
    def error(self) -> str | None:
        return self.agent.error

    # ----------------------------------------------------------------- REPL
    def run(self) -> None:
        """Read requests and commands until /quit, end of input or an unrecoverable error."""
        self.console.print(Text(HELP, style="dim"))
        while True:
            try:
                line = self.read_line("you> ")
            except EOFError:
                self.console.print()
                break
            except Terminated:  # SIGTERM / SIGHUP end the chat (Ctrl-C only prints the hint below)
                raise
            except KeyboardInterrupt:  # at the prompt: nothing runs, so just say how to leave
                self.console.print(Text("\n(type /quit to leave)", style="dim"))
                continue
            if not self.handle(line):
                break
        self._offer_patch()

    def handle(self, line: str) -> bool:
        """One line of user input; False when the chat should end."""
        line = line.strip()
        if not line:
            return True
        if line.startswith("/"):
            return self.command(line)
        if self.closed:
            self._say(f"{self.closed}; use /diff, /save FILE or /quit", "yellow")
            return True
        status = self.ask(line)
        return status not in ("quit", "error")

    def command(self, line: str) -> bool:
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name in ("/quit", "/exit", "/q"):
            return False
        if name == "/help":
            self.console.print(Text(HELP))
        elif name == "/diff":
            self._show_diff(self._diff())
        elif name == "/save":
            self.save(arg)
        elif name == "/stats":
            self.console.print(Text(self.stats_text()))
        else:
            self._say(f"unknown command {name}; type /help for the list", "yellow")
        return True

    def ask(self, request: str) -> str:
        """One request (see `ChatAgent.ask`), with Ctrl-C asking the agent to stop its reply."""
        with self._sigint(raising=False):
            status = self.agent.ask(request)
        self._end_request(status)
        return status

    def _approve(self, turn: Turn, call: ToolCall) -> str | None:
        if self.approval == "yolo" or call.name == FINISH_TOOL:
            return None
        with self._sigint(raising=True):
            while True:
                try:
                    key = self.read_key("run it? [y]es / [n]o / [q]uit: ").strip().lower()
                except EOFError:
                    raise ChatQuit from None
                if key == "y":
                    return None
                if key == "n":
                    return DECLINED
                if key == "q":
                    raise ChatQuit

    def _end_request(self, status: str) -> None:
        self._end_stream()
        agent = self.agent
        last = agent.turns[-1] if agent.turns else None
        if status == "submitted" and last is not None and last.call:
            result = last.call["params"].get("result", "").strip()
            self.console.print(Panel(Text(result or "(no summary)"), title="done", border_style="green"))
        elif status == "step_limit":
            if last is not None and last.observation:
                self._show_observation(last.observation)
            n = agent.config.max_steps
            self._say(f"stopped at the step limit ({n} per request); ask again to go on", "yellow")
        elif status == "context_limit":
            self.closed = f"the context limit ({agent.config.context_limit:,} tokens) is reached"
            self._say(f"{self.closed}; /diff and /save still work", "red")
        elif status == INTERRUPTED:
            self._say("interrupted; the partial reply stays in the conversation", "yellow")
        elif status == "error":
            self._say(f"error: {agent.error}; the chat cannot go on", "red")
        self._status_line()

    # ----------------------------------------------------------------- display
    def _on_event(self, event: AgentEvent) -> None:
        turn = event.turn
        if event.kind == "reply" and turn is not None:
            self._end_stream()
            if turn.call:
                self._show_call(turn)
            else:
                self._say(f"(no valid call: {turn.call_error})", "yellow")
        elif event.kind == "observation" and turn is not None:
            self._show_observation(turn.observation or "")
            self._status_line()

    def _show_text(self, text: str) -> None:
        self._streamed = True
        self.console.print(Text(text), end="")

    def _end_stream(self) -> None:
        if self._streamed:
            self.console.print()
            self._streamed = False

    def _show_call(self, turn: Turn) -> None:
        call = turn.call or {}
        body = Text()
        for i, (key, value) in enumerate(call.get("params", {}).items()):
            body.append(("\n" if i else "") + f"{key}: ", style="bold")
            body.append(value if "\n" not in value else "\n" + value)
        title = f"step {self.agent.request_steps}: {call.get('name')}"
        self.console.print(Panel(body, title=title, title_align="left", border_style="cyan"))

    def _show_observation(self, text: str) -> None:
        self.console.print(Text(trim_lines(text, SHOWN_LINES), style="dim"))

    def _status_line(self) -> None:
        self.console.print(Text(cache_status(self.session.stats, self.cache), style="dim cyan"))

    def _say(self, text: str, style: str = "") -> None:
        self.console.print(Text(text, style=style))

    def stats_text(self) -> str:
        a = self.agent
        generated = sum(t.reply_tokens for t in a.turns)
        return (
            f"requests {a.requests} | steps {len(a.turns)} | prompt {a.prompt_tokens:,} tokens | "
            f"generated {generated:,} tokens\n{cache_status(self.session.stats, self.cache)}"
        )

    # ----------------------------------------------------------------- the patch
    def _diff(self) -> str | None:
        try:
            return self.env.diff()
        except Exception as e:
            self._say(f"cannot compute the diff: {type(e).__name__}: {e}", "red")
            return None

    def _show_diff(self, patch: str | None) -> None:
        if patch is None:
            return
        if not patch:
            self._say("no changes yet", "dim")
            return
        from rich.syntax import Syntax

        self.console.print(Syntax(patch, "diff", theme="ansi_dark", background_color="default"))

    def save(self, path: str) -> Path | None:
        from kvagent.fileio import atomic_write_text

        if not path:
            self._say("usage: /save FILE", "yellow")
            return None
        patch = self._diff()
        if patch is None:
            return None
        target = Path(path).expanduser()
        try:
            atomic_write_text(target, patch)
        except OSError as e:
            self._say(f"cannot write {target}: {e.strerror or e}; pick another path", "red")
            return None
        note = "" if patch else " (empty: no changes yet)"
        self._say(f"patch written to {target}{note}", "green")
        return target

    def _offer_patch(self) -> None:
        """At the end: the copy is about to go, so offer to show and keep the agent's changes."""
        patch = self._diff()
        if not patch:
            return
        files = sum(1 for line in patch.splitlines() if line.startswith("diff --git "))
        try:
            key = self.read_key(f"the agent changed {files} file(s); show the patch? [y/n]: ").strip().lower()
            if key == "y":
                self._show_diff(patch)
            path = self.read_line("save the patch to (Enter = don't save): ").strip()
        except Terminated:
            raise
        except (EOFError, KeyboardInterrupt):
            self.console.print()
            return
        if path:
            self.save(path)

    # ----------------------------------------------------------------- Ctrl-C
    def _on_sigint(self, signum: int, frame: Any) -> None:
        self.agent.interrupt()

    @contextlib.contextmanager
    def _sigint(self, raising: bool) -> Iterator[None]:
        if not self.handle_sigint or threading.current_thread() is not threading.main_thread():
            yield
            return
        old = signal.signal(signal.SIGINT, signal.default_int_handler if raising else self._on_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, old)


def run_chat(
    *,
    repo: str = ".",
    engine: EngineOptions,
    cache: CacheOptions | Mapping[str, Any],
    agent: AgentOptions | Mapping[str, Any],
    approval: str = "confirm",
    isolation: str = "bwrap",
    console: Console | None = None,
    session_file: str | None = None,
) -> ChatSession:
    """`kvagent chat`: validate, load the model, copy the repository (default: the current directory)
    into a sandbox, then chat. With `session_file`, a chat saved there continues (its cache config
    is the saved one) and the chat is saved there when it ends (resume.py)."""
    from kvagent.cli import environments
    from kvagent.cli.chat import resume as chat_resume
    from kvagent.cli.common import load_engine, sandbox_workdir
    from kvagent.cli.settings import agent_config_of, cache_config_of
    from kvagent.cli.solve import check_before_sandbox, sandbox_spec
    from kvagent.runspec import RunSpec
    from kvagent.sandbox import open_sandbox

    cfg, config = cache_config_of(cache), agent_config_of(agent)
    if approval not in APPROVALS:
        raise ConfigError(f"approval: got {approval!r}; choose one of {', '.join(APPROVALS)}")
    spec = environments.with_isolation(sandbox_spec(repo, None), isolation)
    console = console or Console()
    console.print(Text(f"loading model {engine.model} ...", style="dim"))
    engine = load_engine(engine)
    # The first request is not known yet: its prompt counted without it (the least it can be).
    check_before_sandbox(engine, cfg, config, "", sandbox_workdir(spec["backend"]))
    resume = session_file is not None and Path(session_file).exists()
    session = engine.load_session(session_file) if resume else engine.session(cfg)
    if resume:
        cfg = session.config  # a resumed chat keeps the cache it was saved with
    with open_sandbox(**spec) as sandbox:
        console.print(
            Text(
                f"working on a copy of {spec['repo']} (your checkout is never edited) | "
                f"{RunSpec.of(cfg).label} | approval: {approval}",
                style="dim",
            ),
            soft_wrap=True,  # the whole path, to copy
        )
        chat = ChatSession(
            session,
            sandbox,
            engine.tokenizer,
            config,
            approval=approval,
            console=console,
            cache=cfg,
        )
        if resume:
            chat_resume.resume_chat(chat, session_file)
            note = f"continuing the chat saved in {session_file} ({session.logical_length:,} tokens)"
            console.print(Text(note, style="dim"))
        chat.run()
        if session_file is not None:
            size = chat_resume.save_chat(chat, session_file)
            console.print(Text(f"chat saved to {session_file} ({size:,} bytes)", style="dim"))
    if chat.error:
        raise KvagentError(f"chat ended on an error: {chat.error}")
    return chat
