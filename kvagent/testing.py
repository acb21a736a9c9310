"""Deterministic doubles of a model session and an engine, for tests of anything above the runtime
(the agent loop, chat, the eval runner): fixed replies played back over a real tokenizer.

    session = ScriptedSession(tokenizer, ["<function=finish>...</function>"])
    result = run_episode(session, env, issue, tokenizer=tokenizer)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

IM_END = "<|im_end|>"


@dataclass
class Generated:
    ids: list[int]
    text: str
    finish_reason: str


@dataclass
class FakeStats:
    """The fields of `kvagent.runtime.CacheStats` that the layers above read."""

    logical_length: int
    entries: list[int]
    total_kv_bytes: int
    rounds: int = 0
    evicted: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class ScriptedSession:
    """Plays back fixed replies as a model would: stops after a stop string (finish `stop`), else
    ends the reply with `<|im_end|>` (finish `eos`); every returned id is fed, as the runtime does.

    With `on_token`, ids are handed out one at a time as `Session.generate` does: `on_token(id)`
    returning true ends the reply there (`interrupted`), and the rest of that reply is dropped.
    `after_token(n)`, if set, is called with the count of ids handed out so far (a test's hook)."""

    def __init__(
        self, tokenizer: Any, replies: Sequence[str], budget: int | None = None, layers: int = 2
    ) -> None:
        self.tokenizer = tokenizer
        self.replies = deque(replies)
        self.history: list[int] = []
        self.budget, self.layers = budget, layers
        self.calls: list[dict[str, Any]] = []
        self.appends: list[int] = []
        self.after_token: Callable[[int], None] | None = None
        self.handed = 0
        self.forgotten: list[list[int]] = []  # the positions of each forget() call

    @property
    def logical_length(self) -> int:
        return len(self.history)

    @property
    def stats(self) -> FakeStats:
        held = len(self.history) if self.budget is None else min(len(self.history), self.budget)
        return FakeStats(len(self.history), [held] * self.layers, held * self.layers * 64)

    def append(self, ids: Sequence[int]) -> None:
        assert ids, "append of an empty chunk"
        self.appends.append(len(ids))
        self.history.extend(int(i) for i in ids)

    def generate(
        self,
        max_new_tokens: int,
        sampling: Any = None,
        stop: Sequence[str] = (),
        on_token: Callable[[int], bool | None] | None = None,
    ) -> Generated:
        assert max_new_tokens >= 1
        self.calls.append({"max_new_tokens": max_new_tokens, "sampling": sampling, "stop": list(stop)})
        if not self.replies:
            raise AssertionError("the scripted model ran out of replies")
        text = self.replies.popleft()
        cut = min((text.find(s) + len(s) for s in stop if s in text), default=-1)
        if cut >= 0:
            ids, reason = self.tokenizer.encode(text[:cut], add_special_tokens=False), "stop"
        else:
            ids = [
                *self.tokenizer.encode(text, add_special_tokens=False),
                self.tokenizer.convert_tokens_to_ids(IM_END),
            ]
            reason = "eos"
        if len(ids) > max_new_tokens:
            ids, reason = ids[:max_new_tokens], "length"
        out: list[int] = []
        for token in ids:
            out.append(token)
            self.history.append(token)
            self.handed += 1
            if self.after_token is not None:
                self.after_token(self.handed)
            if on_token is not None and on_token(token) and len(out) < len(ids):
                reason = "interrupted"
                break
        return Generated(out, self.tokenizer.decode(out), reason)

    def forget(self, positions: Sequence[int]) -> int:
        """Records the call (`forgotten`); like persistent mode, positions and history stay."""
        drop = sorted(set(int(p) for p in positions))
        assert all(0 <= p < len(self.history) for p in drop), "forget of a position not fed"
        self.forgotten.append(drop)
        return len(drop)


class ScriptedEngine:
    """An engine double: `session(config)` plays back `replies(config)`; counts the sessions made."""

    def __init__(self, tokenizer: Any, replies: Callable[[Any], Sequence[str]]) -> None:
        self.tokenizer, self.replies = tokenizer, replies
        self.sessions = 0

    def session(self, config: Any) -> ScriptedSession:
        self.sessions += 1
        return ScriptedSession(self.tokenizer, list(self.replies(config)))
