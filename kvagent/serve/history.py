"""kv_history on a message list, which a harness re-sends whole every turn: which messages are its
observations, and the paper's masking of the older ones as text (for reprefill sessions; persistent
ones forget their tokens instead: runner.py)."""

from __future__ import annotations

from collections.abc import Sequence


def observations(messages: Sequence[dict]) -> list[int]:
    """Indices of the observations: `tool` messages, and `user` messages after the first reply (a
    harness that acts in text, as mini-swe-agent's default and R2E-Gym do, sends each tool output
    as the user's turn; the user messages before the first reply are the task)."""
    out, replied = [], False
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "assistant":
            replied = True
        elif role == "tool" or (role == "user" and replied):
            out.append(i)
    return out


def masked(messages: Sequence[dict], keep: int) -> list[int]:
    """Indices of the observations older than the newest `keep`."""
    at = observations(messages)
    return at[: max(0, len(at) - keep)]


def mask_messages(messages: Sequence[dict], keep: int) -> list[dict]:
    """Every observation but the newest `keep` as the paper's placeholder line."""
    from kvagent.agent.history import placeholder  # the agent package, only when a request asks

    old = set(masked(messages, keep))
    out = []
    for i, m in enumerate(messages):
        text = m.get("content")
        out.append({**m, "content": placeholder(text)} if i in old and isinstance(text, str) else m)
    return out
