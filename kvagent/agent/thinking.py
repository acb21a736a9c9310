"""`history=drop-thinking`: past replies' reasoning leaves the context, as a Qwen3-style chat template
drops it when R2E-Gym re-renders the conversation each turn.

The template shows an earlier assistant turn as `content.split('</think>')[-1].lstrip('\\n')`:
everything up to the last `</think>` and the newlines right after it are gone. `thinking_offsets`
finds those tokens in a reply; the agent hands their stream positions to `Session.forget` when the
next observation arrives (persistent mode: evicted from the live cache, other positions kept;
reprefill mode: left out of the history re-prefilled next)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

THINK_END = "</think>"


def thinking_offsets(reply_ids: Sequence[int], tokenizer: Any) -> list[int]:
    """Offsets (into `reply_ids`) of the tokens the template would drop: all tokens through the last
    one holding `</think>`, then the following tokens made of newlines only. Empty without `</think>`.

    Works on token boundaries: `</think>` is one token in Qwen3's vocabulary; elsewhere the token that
    completes the tag ends the span. A token mixing newlines with text after the tag is kept whole."""
    pieces = [tokenizer.decode([int(t)], skip_special_tokens=False) for t in reply_ids]
    text, ends = "", []
    for piece in pieces:
        text += piece
        ends.append(len(text))
    cut = text.rfind(THINK_END)
    if cut < 0:
        return []
    tag_end = cut + len(THINK_END)
    last = next(i for i, e in enumerate(ends) if e >= tag_end)
    end = last + 1
    while end < len(pieces) and pieces[end] and set(pieces[end]) <= {"\n"}:
        end += 1
    return list(range(end))


def forget_thinking(session: Any, reply_start: int, reply_ids: Sequence[int], tokenizer: Any) -> int:
    """Forget the reply's thinking tokens (stream positions from `reply_start`); the count forgotten."""
    offsets = thinking_offsets(reply_ids, tokenizer)
    if not offsets:
        return 0
    forget = getattr(session, "forget", None)
    if forget is None:
        from kvagent.errors import ConfigError

        raise ConfigError("history=drop-thinking needs a session with forget(); use keep-thinking")
    forget([reply_start + i for i in offsets])
    return len(offsets)
