"""Segment-aware eviction: a token scorer's scores aggregated per segment, whole segments kept.

SideQuest (arXiv 2602.22603) and AgentKV (OpenReview s80e8otSxP) argue that on agent trajectories a
tool output's usefulness comes and goes as a unit, so eviction should decide per segment (one tool
output, one reply), not per token. Segments are what the session was told (`Session.mark_segment`,
by the agent or the replay), never guessed from text: the entries before the first mark (the system
prompt and the issue) are kept, the newest segment (the one holding the newest entry) is never
scored (the papers' recent buffer at segment granularity), and every other segment ranks by the
mean (or max) of `scorer`'s scores over its candidate entries. Within a segment newer entries rank
first, so under the runtime's top-K the segments that fit are kept whole and at most one, the last
that fits, keeps part of itself (its newest entries). With no segment marked it is `scorer`.
Marks are logical positions: a reprefill session's forget or rewind (which shift or cut its
history) does not move them, and a saved session (persist.py) does not carry them yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from kvagent.runtime.policies._args import knob
from kvagent.runtime.policies.base import BasePolicy, LayerView, make_policy, register

REDUCE = ("mean", "max")


def _scorer(name: str, value: Any) -> str:
    """A token-level scorer that needs nothing from the model or the runtime beyond the view."""
    from kvagent.errors import ConfigError

    inner = make_policy(str(value)) if value != "segments" else None
    if inner is None or inner.block != 1 or inner.model_args or inner.needs_pending_queries:
        raise ConfigError(
            f"policy_args: {name} must be a token scorer without model options or pending queries "
            f"(snapkv, tova, knorm, keydiff, random, ...), got {value!r}"
        )
    return str(value)


def _reduce(name: str, value: Any) -> str:
    if value not in REDUCE:
        from kvagent.errors import ConfigError

        raise ConfigError(f"policy_args: {name} must be one of {', '.join(REDUCE)}, got {value!r}")
    return str(value)


@register
@dataclass
class SegmentPolicy(BasePolicy):
    """Segment-aware eviction over a token scorer (SideQuest, arXiv 2602.22603; AgentKV)."""

    name = "segments"

    scorer: str = knob("snapkv", _scorer)
    reduce: str = knob("mean", _reduce)
    _inner: BasePolicy | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._inner = make_policy(self.scorer)

    @property
    def shared_across_heads(self) -> bool:  # type: ignore[override]
        return self._inner.shared_across_heads

    def scores(self, view: LayerView) -> torch.Tensor:
        s = self._inner.scores(view).to(torch.float32)
        starts = view.segment_starts
        if starts is None or starts.numel() == 0:
            return s
        pos = view.positions if s.shape[1] == view.positions.shape[1] else view.positions[:, :1]
        seg = (
            torch.bucketize(pos.contiguous(), starts.to(pos.device), right=True) - 1
        )  # -1: before the first mark
        real = pos >= 0
        newest = torch.where(real, seg, -1).amax(dim=-1, keepdim=True)
        cand = (
            view.candidates
            if s.shape[1] == view.candidates.shape[1]
            else view.candidates.any(1, keepdim=True)
        )
        cand = cand & (seg >= 0) & (seg < newest)
        n_seg = starts.numel()
        idx = seg.clamp(min=0)
        finite = torch.where(cand, s, torch.zeros_like(s))
        if self.reduce == "mean":
            total = torch.zeros(*s.shape[:2], n_seg, device=s.device).scatter_add_(-1, idx, finite)
            count = torch.zeros_like(total).scatter_add_(-1, idx, cand.float())
            agg = total / count.clamp(min=1)
        else:
            low = torch.full((*s.shape[:2], n_seg), -torch.inf, device=s.device)
            agg = low.scatter_reduce(-1, idx, torch.where(cand, s, -torch.inf), reduce="amax")
        # Rank segments by their score (ties: the newer first), then newer entries first inside one:
        # integer part = the segment's rank, fraction = the entry's place in position order.
        order = torch.argsort(
            torch.argsort(agg + 1e-6 * torch.arange(n_seg, device=s.device), dim=-1), dim=-1
        )
        n = s.shape[-1]
        within = torch.arange(n, device=s.device, dtype=torch.float32) / max(n, 1)
        out = order.gather(-1, idx).to(torch.float32) + within
        keep = real & ((seg < 0) | (seg >= newest))  # the prompt and the newest segment: always kept
        return torch.where(keep, torch.full_like(out, torch.inf), out)
