"""Observation masking in replays (`bench fidelity --history`, the segments study): the rule of
`kvagent.agent.history` applied to a recorded stream, whose observations `build_stream` marked.

Before each appended segment, the observations it pushes out of the newest M (those fed already)
leave: persistent mode forgets their content positions (`Session.forget`: gone from every layer
and head, positions kept); reprefill mode takes the history back to the first of them
(`Session.rewind`) and appends it again with each one's content as its placeholder line, so the
next append re-prefills the history the paper's agent would re-send. An observation sharing its
segment with M newer ones is masked at the next segment (the replay never splits a segment).

A run is named by `HistorySpec`: a RunSpec with the history it replays under, which its record,
key and label carry (`__mask-observations=4`)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from kvagent.agent.history import newly_masked, parse_history
from kvagent.bench.stream import Stream
from kvagent.errors import ConfigError
from kvagent.runspec import RunSpec

KEEP_ALL = "keep"  # the replay as recorded


def keep_of(history: str | None) -> int | None:
    """M of a replay's history (None: every observation kept). Replays take observation masking
    only: a trajectory's replies are what the model wrote, not a reply rule to apply again."""
    if history in (None, KEEP_ALL):
        return None
    rules = parse_history(history)
    if rules.reply != "keep-thinking" or rules.keep is None:
        raise ConfigError(f"history: replays take {KEEP_ALL} or mask-observations[=M], got {history!r}")
    return rules.keep


@dataclass(frozen=True)
class HistorySpec(RunSpec):
    """A RunSpec replayed under a history (`mask-observations=M`); its record has `history`."""

    history: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        keep_of(self.history)
        if self.history == KEEP_ALL:
            object.__setattr__(self, "history", None)

    def __hash__(self) -> int:
        return hash((super().__hash__(), self.history))

    def record(self) -> dict[str, Any]:
        rec = super().record()
        if self.history is not None:
            rec["history"] = self.history
        return rec

    def cache_config(self, **options: Any):
        rec = {k: v for k, v in self.record().items() if k != "history"}
        from kvagent.runtime.config import CacheConfig

        return CacheConfig(**{**rec, "policy_args": dict(self.policy_args), **options})

    @property
    def label(self) -> str:
        return super().label + (f"__{self.history}" if self.history else "")

    @property
    def canonical(self) -> RunSpec:
        return self if self.history else super().canonical

    @property
    def replays_reference(self) -> bool:
        """The full cache with nothing masked: the reference run itself."""
        return self.policy == "full" and self.history is None

    @classmethod
    def of_record(cls, record) -> HistorySpec:
        base = RunSpec.from_record(record)
        spec = cls.__new__(cls)
        for k, v in vars(base).items():
            object.__setattr__(spec, k, v)
        object.__setattr__(spec, "history", record.get("history"))
        return spec


def history_of(spec: RunSpec) -> str | None:
    return getattr(spec, "history", None)


class Masker:
    """`before_append` of one replay (replay.py calls it before each appended segment)."""

    def __init__(self, stream: Stream, keep: int) -> None:
        self.stream, self.keep = stream, keep
        self.ids = stream.ids
        self.starts = stream.segment_starts
        self.masked = 0
        self.shrunk = 0  # reprefill: tokens the placeholders saved so far (session = stream - shrunk)
        self.forgotten = 0  # persistent: positions forgotten

    def __call__(self, session, pos: int, ids: list[int]) -> list[int]:
        obs = self.stream.observations
        fed = sum(1 for o in obs if o.end <= pos)
        # the segment brings observation `fed` (if it holds one): with it the newest `keep` stay whole
        incoming = fed if any(pos <= o.start < pos + len(ids) for o in obs) else fed - 1
        todo = [i for i in newly_masked(incoming, self.keep, self.masked) if obs[i].end <= pos]
        if not todo:
            return ids
        self.masked = todo[-1] + 1
        if session.config.mode == "persistent":
            for i in todo:
                self.forgotten += session.forget(list(range(obs[i].start, obs[i].end)))
            return ids
        first = obs[todo[0]]
        cut = first.start - self.shrunk
        new, marks, cursor = [], [], first.start
        for i in todo:
            o = obs[i]
            marks += self._moved(cursor, o.start, cut + len(new))
            new += self.ids[cursor : o.start]
            marks.append(cut + len(new))  # the placeholder is the observation's segment
            new += o.placeholder
            self.shrunk += (o.end - o.start) - len(o.placeholder)
            cursor = o.end
        marks += self._moved(cursor, pos, cut + len(new))
        new += self.ids[cursor:pos]
        # The rewind drops the segment marks past the cut; the re-sent tokens keep theirs, moved.
        session.rewind(session.logical_length - cut)
        mark = getattr(session, "mark_segment", None)  # a ledger without marks (the study's) ignores them
        for m in marks if mark is not None else ():
            mark(m)
        return [*new, *ids]

    def _moved(self, lo: int, hi: int, at: int) -> list[int]:
        """Session positions of the segment starts in stream [lo, hi), re-sent from position `at`."""
        return [
            at + s - lo
            for s in self.starts[bisect.bisect_left(self.starts, lo) : bisect.bisect_left(self.starts, hi)]
        ]


def masker_for(stream: Stream, spec: RunSpec) -> Masker | None:
    keep = keep_of(history_of(spec))
    return Masker(stream, keep) if keep is not None else None


def with_histories(grid, histories) -> list[RunSpec]:
    """`bench fidelity --history keep,mask-observations=4`: every spec of `grid` once per history
    (each value checked before any run); `keep` leaves a spec as it is."""
    out: list[RunSpec] = []
    for h in histories:
        keep_of(h)
        for s in grid:
            out.append(
                s
                if h == KEEP_ALL
                else HistorySpec(**{**s.record(), "policy_args": dict(s.policy_args)}, history=h)
            )
    return list(dict.fromkeys(out))
