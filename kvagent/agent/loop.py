"""The agent loop: one append-only token stream over one live session.

prompt -> append -> generate (stop at `</function>`) -> parse -> run the tool -> append the
observation -> generate ... until `finish`, the step limit, the context limit or an error."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvagent.agent import r2egym
from kvagent.agent.config import AgentConfig, generation_defaults
from kvagent.agent.episode import (
    EXIT_STATUSES,
    INTERRUPTED,
    AgentEvent,
    EpisodeInterrupted,
    EpisodeResult,
    Turn,
    cache_summary,
)
from kvagent.agent.history import ObservationMask, content_span
from kvagent.agent.interfaces import Environment, ModelSession
from kvagent.agent.parser import ToolCall
from kvagent.agent.scaffold import make_scaffold
from kvagent.agent.template_render import make_renderer
from kvagent.agent.thinking import forget_thinking
from kvagent.errors import KvagentError

# The episode's records are importable from here too (callers of the loop use them).
__all__ = [
    "EXIT_STATUSES", "INTERRUPTED", "Agent", "AgentEvent", "EpisodeInterrupted", "EpisodeResult", "Turn",
    "cache_summary", "run_episode", "session_tokenizer",
]  # fmt: skip


@dataclass
class Agent:
    session: ModelSession
    env: Environment
    tokenizer: Any
    config: AgentConfig = field(default_factory=AgentConfig)
    on_event: Callable[[AgentEvent], None] | None = None
    # Called before each tool runs (chat's confirm mode): None runs it, a string is the observation
    # sent instead (e.g. "the user declined").
    approve: Callable[[Turn, ToolCall], str | None] | None = None

    def __post_init__(self) -> None:
        self.render = make_renderer(self.tokenizer)  # the model's chat template, else ChatML
        # top_p / top_k the config leaves unset: the model's generation_config.json, as vLLM does
        self.config = self.config.with_model_defaults(generation_defaults(self.session))
        self.scaffold = make_scaffold(self.config)
        self._reply_start = 0  # stream position of the last reply's first token
        self.forgotten = 0  # tokens forgotten from the stream (history=drop-thinking)
        self.messages: list[dict[str, str]] = []
        self.turns: list[Turn] = []
        self.prompt_tokens = 0
        self._last_reply_ids: list[int] = []
        self.first_step = 0  # turns before the current request (chat); step limits count from here
        self._prepared = False  # the scaffold's set-up of the environment (Scaffold.prepare) done
        keep = self.config.rules.keep  # history=...+mask-observations: the newest `keep` stay whole
        self.mask = ObservationMask(keep, self.render) if keep is not None else None

    def run(self, issue_text: str) -> EpisodeResult:
        if self.messages or self.turns:
            raise KvagentError("an Agent runs one episode; make a new Agent (and session) for the next")
        cfg, started = self.config, time.perf_counter()
        system, user, prompt_ids = self._prompt(issue_text)
        status, error, stopped = None, None, False
        try:
            status = self._start(system, user, prompt_ids)
            if status is None:
                status = self.loop()
        except KeyboardInterrupt:  # Ctrl-C: the partial episode goes up with the interrupt
            status, stopped = INTERRUPTED, True
            self._keep_partial_reply()
        except Exception as e:  # the episode records what went wrong instead of losing its trajectory
            status, error = "error", f"{type(e).__name__}: {e}"
        patches, patch_error = self._patches()
        if patch_error and status != "error":
            status, error = "error", patch_error
        self._emit("end", exit_status=status)
        result = EpisodeResult(
            exit_status=status,
            patch=patches.get(cfg.patch_rule, ""),
            patches=patches,
            graded_patch=cfg.patch_rule,
            renderer=self.render.name,
            messages=self.messages,
            turns=self.turns,
            config=cfg,
            error=error,
            prompt_tokens=self.prompt_tokens,
            logical_length=self.session.logical_length,
            elapsed_s=time.perf_counter() - started,
        )
        if stopped:
            raise EpisodeInterrupted(result)
        return result

    def start(self, issue_text: str) -> str | None:
        """Feed the system prompt and the instance prompt; None, or "context_limit" if it does not fit."""
        return self._start(*self._prompt(issue_text))

    def follow_up(self, text: str) -> str | None:
        """Chat: append a new user request after the last reply (same framing as an observation) and
        count steps afresh from here. None, or "context_limit" if it does not fit."""
        self.first_step = len(self.turns)
        text = self.scaffold.attach(text, self._notice())
        status, _ = self._next_user_turn(text, self.turns[-1] if self.turns else None)
        if status is None:
            self.messages.append({"role": "user", "content": text})
        return status

    def loop(self) -> str:
        """Generate, act and observe until `finish`, the step limit, the context limit or an interrupted
        reply; returns that status. Exceptions propagate (`run` records them)."""
        if not self._prepared:  # R2E-Gym's own tools (--r2egym) before the first reply, once
            self.scaffold.prepare(self.env)
            self._prepared = True
        while True:
            turn = self._reply()
            if turn.finish_reason == INTERRUPTED:
                return INTERRUPTED
            after_step = self.scaffold.token_rule_after_step
            if turn.finish_reason == "length" and self._context_left() <= 0 and not after_step:
                return "context_limit"
            self._act(turn)
            if self.scaffold.ends(turn.call):
                return "submitted"
            if after_step and self._context_left() <= 0:  # R2E-Gym: prompt + reply reached the limit
                return "context_limit"
            if len(self.turns) - self.first_step >= self.config.max_steps:
                return "step_limit"
            status = self._observe(turn)
            if status is not None:
                return status

    def _prompt(self, issue_text: str) -> tuple[str, str, list[int]]:
        cfg = self.config
        repo_dir = cfg.repo_dir or getattr(self.env, "workdir", None) or "/testbed"
        system = self.scaffold.system()
        user = self.scaffold.attach(self.scaffold.instance(issue_text, repo_dir), self._notice())
        return system, user, self.render.prompt_ids(system, user)

    def _start(self, system: str, user: str, prompt_ids: list[int]) -> str | None:
        self.prompt_tokens = len(prompt_ids)
        status = self._feed(prompt_ids)
        if status is None:
            self.messages += [{"role": "system", "content": system}, {"role": "user", "content": user}]
            self._emit("start")
        return status

    def _reply(self) -> Turn:
        turn = Turn(step=len(self.turns) + 1)
        self.turns.append(turn)
        t = time.perf_counter()
        cap = self.config.max_new_tokens
        self._reply_start = self.session.logical_length
        self._mark_segment(self._reply_start)
        left = self._context_left()
        g = self._generate(left if cap is None else min(cap, left))
        turn.generate_s = time.perf_counter() - t
        self._last_reply_ids = [int(i) for i in g.ids]
        turn.reply = self.render.decode(self._last_reply_ids)  # the stream's text, not a re-tokenisable copy
        turn.reply_tokens, turn.finish_reason = len(self._last_reply_ids), g.finish_reason
        self.messages.append({"role": "assistant", "content": turn.reply})
        self._record_cache(turn)
        return turn

    def _keep_partial_reply(self) -> None:
        """Ctrl-C mid-reply: the tokens already fed are in the session's stream, so the turn keeps
        what the model had written (often minutes of thinking on a GPU) instead of an empty reply."""
        turn = self.turns[-1] if self.turns else None
        history = getattr(self.session, "history", None)
        if turn is None or turn.finish_reason or history is None:
            return
        ids = [int(i) for i in history[self._reply_start :]]
        if not ids:
            return
        self._last_reply_ids = ids
        turn.reply, turn.reply_tokens, turn.finish_reason = self.render.decode(ids), len(ids), INTERRUPTED
        self.messages.append({"role": "assistant", "content": turn.reply})
        self._record_cache(turn)

    def _act(self, turn: Turn) -> None:
        """Run the reply's call (or explain why it cannot run) and set the turn's observation."""
        reading = self.scaffold.read(turn.reply)
        call = reading.call
        if call is not None:
            turn.call = {"name": call.name, "params": call.params}
        if call is None or reading.observation is not None:
            turn.call_error, turn.observation = reading.problem, reading.observation
            self._emit("reply", turn)
            return
        self._emit("reply", turn)
        declined = self.approve(turn, call) if self.approve is not None else None
        if declined is not None:
            turn.observation = declined
            return
        t = time.perf_counter()
        result = self._run_tool(call)
        turn.tool_s = time.perf_counter() - t
        turn.observation = self.scaffold.observe(call.name, result, self.config.command_timeout)

    # Hooks for variants (chat): how a reply is generated and how a call runs.
    def _generate(self, max_new_tokens: int) -> Any:
        return self.session.generate(
            max_new_tokens, sampling=self.config.sampling(), stop=list(self.scaffold.stop)
        )

    def _run_tool(self, call: ToolCall) -> Any:
        return self.scaffold.run(self.env, call, self.config.command_timeout)

    def _observe(self, turn: Turn) -> str | None:
        text = self.scaffold.attach(turn.observation or "", self._notice())
        t = time.perf_counter()
        self._mask_observations(turn)
        status, fed = self._next_user_turn(text, turn)
        turn.append_s = time.perf_counter() - t
        if status is None:
            turn.observation, turn.observation_tokens, turn.fed = text, fed, True
            if self.mask is not None:
                self.mask.track(self.session, text, self.session.history[-fed:])
            tail = self.render.user_turn_ids(text)  # the observation's content starts the segment
            self._mark_segment(
                self.session.logical_length - len(tail) + content_span(tail, self.render.user_turn_ids(""))[0]
            )
            self.messages.append({"role": "user", "content": text})
            self._record_cache(turn)
            self._emit("observation", turn)
        return status

    def _next_user_turn(self, text: str, turn: Turn | None) -> tuple[str | None, int]:
        """Feed the user turn `text` after the last reply, the history rule applied to that reply
        first (once): drop-thinking forgets its reasoning; r2egym puts R2E-Gym's rendering of it in
        its place. (status, tokens appended)."""
        if self.config.rules.reply == "r2egym" and self._reply_start >= 0 and turn is not None:
            return self._rerender_reply(text, turn)
        forgotten = self._drop_thinking()
        if turn is not None and forgotten:
            turn.thinking_forgotten = forgotten
        ids = self.render.observation_ids(text, self._last_reply_ids)
        return self._feed(ids), len(ids)

    def _rerender_reply(self, text: str, turn: Turn) -> tuple[str | None, int]:
        """history=r2egym: take the reply back (Session.rewind, so positions stay contiguous) and
        append what R2E-Gym's next call sends in its place: with the full cache the stream is the one
        R2E-Gym would send. The turn keeps the reply verbatim; `messages` follows the stream."""
        content = r2egym.history_content(turn.reply)
        # The first reply's opening belongs to the prompt (the first append), never taken back.
        extra, ids = self.render.assistant_turn_ids(content, self._reply_start > self.prompt_tokens)
        ids += self.render.user_turn_ids(text)
        back = self.session.logical_length - self._reply_start + extra
        if self._used() - back + len(ids) >= self.config.context_limit:
            return "context_limit", 0
        if not hasattr(self.session, "rewind"):
            raise KvagentError("history=r2egym needs a session with rewind(); use keep-thinking")
        self.session.rewind(back)
        self.session.append(ids)
        self._reply_start, turn.rewound = -1, back  # this reply is done with
        self.messages[-1] = {"role": "assistant", "content": content}
        return None, len(ids)

    def _feed(self, ids: list[int]) -> str | None:
        """Append `ids` unless that leaves no room to generate within the context limit."""
        if self._used() + len(ids) >= self.config.context_limit:
            return "context_limit"
        self.session.append(ids)
        return None

    def _used(self) -> int:
        """Tokens the model reads: the stream less what drop-thinking forgot (their positions stay)."""
        return self.session.logical_length - self.forgotten

    def _context_left(self) -> int:
        """Tokens the model may still read before the context limit (not the runtime's round room)."""
        return self.config.context_limit - self._used()

    def _notice(self) -> str:
        return self.scaffold.notice(len(self.turns) - self.first_step)

    def _drop_thinking(self) -> int:
        """history=drop-thinking: forget the last reply's reasoning before the next user turn (once)."""
        if self.config.rules.reply != "drop-thinking" or not self._last_reply_ids or self._reply_start < 0:
            return 0
        before = self.session.logical_length
        n = forget_thinking(self.session, self._reply_start, self._last_reply_ids, self.tokenizer)
        self._reply_start = -1  # this reply is done with
        # persistent mode keeps positions (the stream length stays); reprefill mode shortens the stream
        self.forgotten += n - (before - self.session.logical_length)
        return n

    def _mask_observations(self, turn: Turn) -> None:
        """history=...+mask-observations: before an observation is fed, the one it pushes out of the
        newest M leaves (persistent: forgotten; reprefill: re-rendered as the placeholder line)."""
        if self.mask is None:
            return
        if not hasattr(self.session, "forget") or not hasattr(self.session, "rewind"):
            raise KvagentError("history=mask-observations needs a session with forget() and rewind()")
        before = self.session.logical_length
        forgotten, shrunk = self.mask.mask_before_next(self.session)
        self.forgotten += forgotten
        turn.observations_masked = forgotten + shrunk
        if shrunk and self._reply_start > 0:  # the reply follows the re-rendered observation
            self._reply_start -= before - self.session.logical_length

    def _mark_segment(self, position: int) -> None:
        """Tell the session where a segment (a reply, an observation) starts, for a segment-aware
        policy (runtime/policies/segments.py); a session without the notion ignores it."""
        mark = getattr(self.session, "mark_segment", None)
        if mark is not None:
            mark(position)

    def _record_cache(self, turn: Turn) -> None:
        turn.logical_length = self.session.logical_length
        turn.cache_entries, turn.cache = cache_summary(self.session.stats)

    def _patches(self) -> tuple[dict[str, str], str | None]:
        """The whole diff and R2E-Gym's graded part of it (its .py / str_replace rule)."""
        try:
            full = self.env.diff()
        except Exception as e:
            return {}, f"diff failed: {type(e).__name__}: {e}"
        workdir = self.config.repo_dir or getattr(self.env, "workdir", None) or "/testbed"
        edited = r2egym.edited_paths([t.call for t in self.turns], workdir)
        return {
            "full": full,
            "r2egym": r2egym.graded_patch(r2egym.output_patch(self.env, full), edited),
        }, None

    def _emit(self, kind: str, turn: Turn | None = None, exit_status: str | None = None) -> None:
        if self.on_event is None:
            return
        fill, _ = cache_summary(self.session.stats)
        self.on_event(
            AgentEvent(
                kind=kind,
                step=len(self.turns),
                max_steps=self.config.max_steps,
                logical_length=self.session.logical_length,
                cache_entries=fill,
                stats=self.session.stats,
                turn=turn,
                exit_status=exit_status,
            )
        )


def session_tokenizer(session: Any) -> Any:
    engine = getattr(session, "engine", None)
    tokenizer = getattr(engine, "tokenizer", None) or getattr(session, "tokenizer", None)
    if tokenizer is None:
        raise KvagentError("the session exposes no tokenizer; pass tokenizer=engine.tokenizer to run_episode")
    return tokenizer


def run_episode(
    session: ModelSession,
    env: Environment,
    issue_text: str,
    config: AgentConfig | None = None,
    *,
    tokenizer: Any = None,
    on_event: Callable[[AgentEvent], None] | None = None,
) -> EpisodeResult:
    """Solve one issue in `env` with the model behind `session` (a fresh session: nothing fed yet)."""
    if session.logical_length != 0:
        raise KvagentError(
            f"run_episode needs a fresh session, this one already holds {session.logical_length} tokens"
        )
    agent = Agent(session, env, tokenizer or session_tokenizer(session), config or AgentConfig(), on_event)
    return agent.run(issue_text)
