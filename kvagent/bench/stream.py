"""An episode as one append-only ChatML token stream, cut into segments: `append` for the prompt,
observations and other non-assistant text, `step` for assistant tokens (teacher forced, scored).

Layout is the agent's (`kvagent.agent.render`): each turn is `<|im_start|>role\\n...<|im_end|>\\n`;
an assistant turn is opened right before its reply, the reply ends with `<|im_end|>` (a predicted,
scored token) and the following newline opens the next appended chunk. `tool` messages are shown as
`user` turns, as the agent shows observations."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from kvagent.agent.render import ChatMLRenderer
from kvagent.bench.episodes import Episode
from kvagent.errors import KvagentError


@dataclass(frozen=True)
class Segment:
    kind: str  # "append" | "step"
    ids: tuple[int, ...]


@dataclass(frozen=True)
class ProbeIds:
    question: tuple[int, ...]  # appended: closes the episode, asks, opens the assistant turn
    prefix: tuple[int, ...]  # teacher forced, not scored
    value: tuple[int, ...]  # teacher forced; log p of these is the probe's score
    value_text: str


@dataclass(frozen=True)
class Stream:
    name: str
    segments: tuple[Segment, ...]
    probe: ProbeIds | None

    @property
    def ids(self) -> list[int]:
        return [t for s in self.segments for t in s.ids]

    @property
    def prompt_length(self) -> int:
        return len(self.segments[0].ids)

    @property
    def n_scored(self) -> int:
        return sum(len(s.ids) for s in self.segments if s.kind == "step")

    @property
    def n_turns(self) -> int:
        return sum(s.kind == "step" for s in self.segments)

    def digest(self) -> str:
        """Identifies the exact token stream (results of a changed episode are not reused)."""
        h = hashlib.sha1()
        for s in self.segments:
            h.update(s.kind.encode())
            h.update(",".join(map(str, s.ids)).encode())
        if self.probe:
            h.update(repr(self.probe).encode())
        return h.hexdigest()[:12]


def build_stream(episode: Episode, tokenizer, max_tokens: int | None = None) -> Stream:
    """Render `episode`; with `max_tokens`, drop whole turns past that length (the probe is added
    after the cut)."""
    r = ChatMLRenderer(tokenizer)
    newline = r.encode("\n")

    def turn(role: str, content: str) -> list[int]:
        return [r.im_start, *r.encode(f"{role}\n{content}"), r.im_end, *newline]

    segments: list[Segment] = []
    pending: list[int] = []
    length = 0
    for m in episode.messages:
        if m["role"] == "assistant":
            pending += r.assistant_open()
            reply = [*r.encode(m["content"]), r.im_end]
            if max_tokens and segments and length + len(pending) + len(reply) > max_tokens:
                pending = pending[: -len(r.assistant_open())]
                break
            segments.append(Segment("append", tuple(pending)))
            segments.append(Segment("step", tuple(reply)))
            length += len(pending) + len(reply)
            pending = list(newline)
        else:
            role = "user" if m["role"] == "tool" else m["role"]
            pending += turn(role, m["content"])
    if not segments:
        raise KvagentError(f"episode {episode.name}: no assistant turn to replay")
    probe = None
    if episode.probe is not None:
        p = episode.probe
        question = [*pending, *turn("user", p.question), *r.assistant_open()]
        probe = ProbeIds(
            question=tuple(question),
            prefix=tuple(r.encode(p.answer_prefix)),
            value=tuple(r.encode(" " + p.value)),
            value_text=p.value,
        )
    elif pending:
        segments.append(Segment("append", tuple(pending)))
    return Stream(name=episode.name, segments=tuple(segments), probe=probe)
