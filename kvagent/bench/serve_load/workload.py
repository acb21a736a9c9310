"""The workload `kvagent bench serve` replays: recorded agent episodes cut into turns. Turn t sends the
history (every earlier recorded reply and observation) plus the next observation, and asks for the
recorded reply's length; the next turn continues with the RECORDED reply, not the sampled one, so
every server sees the same token streams whatever it samples.

Observations go out as `user` messages: a `tool` message is rendered by one server's template and
folded by another's, and the streams would differ. A run's `tag` opens every conversation's first
message, so a server that kept an earlier run's prefixes (vLLM's prefix cache, kvagent's live
sessions) starts this one cold; the conversations of one run still share what they share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvagent.bench.episodes import Episode
from kvagent.errors import ConfigError


@dataclass(frozen=True)
class Turn:
    messages: list[dict[str, str]]  # the request's messages: history + this observation
    max_tokens: int  # the recorded reply's length in tokens (at least 1, at most the cap)
    prompt_tokens: int  # the messages as the tokenizer renders them (with the generation prompt)


@dataclass
class Conversation:
    name: str
    turns: list[Turn] = field(default_factory=list)

    @property
    def final_length(self) -> int:
        """Tokens a dense cache holds after the last reply."""
        last = self.turns[-1]
        return last.prompt_tokens + last.max_tokens


@dataclass(frozen=True)
class Limits:
    max_turns: int = 8  # turns per conversation at most
    max_context: int = 4096  # a turn whose prompt + reply would pass this ends the conversation
    max_reply: int = 256  # replies asked for at most this many tokens

    def __post_init__(self) -> None:
        for name, option in (
            ("max_turns", "turns"),
            ("max_context", "max-context"),
            ("max_reply", "max-reply"),
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{option}: must be >= 1, got {getattr(self, name)}")


def _as_sent(m: dict[str, str]) -> dict[str, str]:
    role = "user" if m["role"] == "tool" else m["role"]
    return {"role": role, "content": m["content"]}


def conversation_of(
    episode: Episode,
    count_prompt: Callable[[list[dict[str, str]]], int],
    count_text: Callable[[str], int],
    limits: Limits,
    tag: str = "",
) -> Conversation:
    """`count_prompt(messages)`: tokens of the rendered chat with its generation prompt;
    `count_text(text)`: tokens of a reply."""
    conv = Conversation(episode.name)
    sent = [_as_sent(m) for m in episode.messages]
    if tag and sent:
        sent[0] = {**sent[0], "content": f"{tag}\n{sent[0]['content']}"}
    for i, m in enumerate(sent):
        if m["role"] != "assistant" or i == 0 or sent[i - 1]["role"] == "assistant":
            continue  # a reply needs an observation (or the task) right before it
        if len(conv.turns) >= limits.max_turns:
            break
        history = sent[:i]
        max_tokens = min(max(1, count_text(m["content"])), limits.max_reply)
        prompt = count_prompt(history)
        if prompt + max_tokens > limits.max_context:
            break
        conv.turns.append(Turn(history, max_tokens, prompt))
    return conv


def build_workload(
    episodes: Sequence[Episode],
    count_prompt: Callable[[list[dict[str, str]]], int],
    count_text: Callable[[str], int],
    limits: Limits,
    conversations: int,
    tag: str = "",
) -> list[Conversation]:
    """The first `conversations` episodes that have at least one turn within the limits (each
    episode once: two copies of one conversation would share their streams)."""
    if conversations < 1:
        raise ConfigError(f"conversations: must be >= 1, got {conversations}")
    out, skipped = [], []
    for ep in episodes:
        conv = conversation_of(ep, count_prompt, count_text, limits, tag)
        (out if conv.turns else skipped).append(conv)
        if len(out) == conversations:
            return out
    why = f" ({len(skipped)} had no turn within --max-context {limits.max_context})" if skipped else ""
    raise ConfigError(
        f"conversations: {conversations} asked for, {len(out)} episodes usable{why}; give more --episodes, "
        "raise --max-context or --clip-chars, or ask for fewer conversations"
    )


def workload_facts(convs: Sequence[Conversation]) -> dict[str, Any]:
    """What the report says about the workload (the same for every server)."""
    turns = [t for c in convs for t in c.turns]
    finals = [c.final_length for c in convs]
    return {
        "conversations": len(convs),
        "turns": len(turns),
        "reply_tokens": sum(t.max_tokens for t in turns),
        "final_length_mean": sum(finals) / len(finals),
        "final_length_max": max(finals),
        "final_tokens_total": sum(finals),
        "first_prompt_mean": sum(c.turns[0].prompt_tokens for c in convs) / len(convs),
    }
