"""Counters a session exposes: what the cache holds now and what eviction has cost so far."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class CacheStats:
    logical_length: int = 0  # tokens fed so far
    entries: list[int] = field(default_factory=list)  # live entries per layer (the most one head holds)
    peak_entries: int = 0  # the most entries one head of any layer has held after a forward
    kv_bytes: list[int] = field(default_factory=list)  # allocated bytes per layer (keys+values+positions)
    rounds: int = 0  # eviction rounds (one round = every layer that was due)
    evicted: int = 0  # entries removed, summed over layers and heads
    forgotten: int = 0  # of those, entries Session.forget dropped
    rewound: int = 0  # tokens Session.rewind took back off the stream (not counted in evicted)
    scoring_s: float = 0.0
    compaction_s: float = 0.0
    prefill_tokens: int = 0  # tokens run through prefill forwards (reprefill counts the history again)
    # reprefill with Session.reuse_prefix: history tokens a rebuild restored instead of running
    # again (prefill_tokens + reused_tokens is what the protocol prefills)
    reused_tokens: int = 0
    decode_tokens: int = 0
    forward_s: float = 0.0  # wall time inside model forwards
    # forwards by how they ran: "static" (the static decode step) or why eager (step.EAGER_REASONS)
    forwards: dict[str, int] = field(default_factory=dict)

    @property
    def total_kv_bytes(self) -> int:
        return sum(self.kv_bytes)

    @property
    def max_entries(self) -> int:
        return max(self.entries, default=0)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["total_kv_bytes"] = self.total_kv_bytes
        return d
