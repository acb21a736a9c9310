"""An episode as one append-only ChatML token stream, cut into segments: `append` for the prompt,
observations and other non-assistant text, `step` for assistant tokens (teacher forced, scored).

Layout is the agent's (`kvagent.agent.render`): each turn is `<|im_start|>role\\n...<|im_end|>\\n`;
an assistant turn is opened right before its reply, the reply ends with `<|im_end|>` (a predicted,
scored token) and the following newline opens the next appended chunk. `tool` messages are shown as
`user` turns, as the agent shows observations.

Observations (a `tool` message, or a `user` one after the first reply: R2E-Gym's and SWE-agent's
tool output) are marked: the stream span of each one's content and the ids of its placeholder line,
for observation masking (`kvagent.agent.history`); the replay reads them, never the text."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from kvagent.agent.history import content_span, placeholder
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
class Observation:
    start: int  # stream span of the content (the turn's framing outside it)
    end: int
    placeholder: tuple[int, ...]  # the content as masking re-renders it (reprefill)


@dataclass(frozen=True)
class Stream:
    name: str
    segments: tuple[Segment, ...]
    probe: ProbeIds | None
    observations: tuple[Observation, ...] = ()
    # more planted facts, each asked on its own copy of the session after the episode
    extra_probes: tuple[ProbeIds, ...] = ()

    @property
    def ids(self) -> list[int]:
        return [t for s in self.segments for t in s.ids]

    @property
    def segment_starts(self) -> list[int]:
        """Where each reply and each observation's content starts: the segments a segment-aware
        policy keeps or evicts whole (replay.py marks them on the session)."""
        starts, pos = {o.start for o in self.observations}, 0
        for s in self.segments:
            if s.kind == "step":
                starts.add(pos)
            pos += len(s.ids)
        return sorted(starts)

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
        for p in self.extra_probes:  # absent: the digest of a stream with one probe is unchanged
            h.update(repr(p).encode())
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
    observations: list[Observation] = []
    length = 0
    replied = False
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
            replied = True
        else:
            role = "user" if m["role"] == "tool" else m["role"]
            ids = turn(role, m["content"])
            if m["role"] == "tool" or (replied and m["role"] == "user"):
                a, b = content_span(ids, turn(role, ""))
                line = turn(role, placeholder(m["content"]))
                pa, pb = content_span(line, turn(role, ""))
                at = length + len(pending)
                observations.append(Observation(at + a, at + b, tuple(line[pa:pb])))
            pending += ids
    if not segments:
        raise KvagentError(f"episode {episode.name}: no assistant turn to replay")
    probe = None
    if episode.probe is not None:

        def ask(p) -> ProbeIds:
            return ProbeIds(
                question=tuple([*pending, *turn("user", p.question), *r.assistant_open()]),
                prefix=tuple(r.encode(p.answer_prefix)),
                value=tuple(r.encode(" " + p.value)),
                value_text=p.value,
            )

        probe = ask(episode.probe)
        extra = tuple(ask(p) for p in episode.extra_probes)
    else:
        extra = ()
        if pending:
            segments.append(Segment("append", tuple(pending)))
    fed = sum(len(s.ids) for s in segments)
    return Stream(name=episode.name, segments=tuple(segments), probe=probe,
                  observations=tuple(o for o in observations if o.end <= fed), extra_probes=extra)  # fmt: skip
