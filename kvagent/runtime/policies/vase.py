"""VaSE: keep the largest-range value states, sample the rest in proportion to SnapKV's score."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvagent.runtime.policies._args import float_knob, knob, odd_kernel
from kvagent.runtime.policies.base import BasePolicy, LayerView, register
from kvagent.runtime.policies.knorm import round_relative
from kvagent.runtime.policies.snapkv import snapkv_scores

_TINY = 1e-30  # floor on sampling weights: a zero weight still gets a finite, lowest key
_WEIGHT_BITS = 12  # sampling weights on a grid of 2^-12 of the head's largest candidate weight


def value_range(values: torch.Tensor) -> torch.Tensor:
    """(B, H_kv, N): max_j v_ij - min_j v_ij over each value vector's components."""
    v = values.float()
    return v.amax(dim=-1) - v.amin(dim=-1)


def sampling_keys(weights: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """log(u) / w per entry (Efraimidis-Spirakis), u uniform from `generator`: the top m by key are
    a sample of m entries without replacement, each draw proportional to w among those left."""
    u = torch.rand(weights.shape, generator=generator, dtype=torch.float64, device=generator.device)
    logu = u.clamp_min(torch.finfo(torch.float64).tiny).log()  # rand may return exactly 0
    return logu.to(weights.device) / weights.double().clamp_min(_TINY)


def grid_weights(scores: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """(B, H_kv, N): each head's scores over its largest candidate score, rounded to multiples of
    2^-12 and at least one step. Why: attention probabilities carry an absolute float error, so a
    weight far below the head's largest is known only to a few bits and the keys log(u)/w that
    divide by it reorder when a batched forward rounds differently from a solo one. On the grid,
    the weights of both runs agree but within 1e-7 of a grid line, and every weight below one step
    is that step (those entries are sampled uniformly among themselves, as they are drawn only once
    the weightier ones run out)."""
    s = scores.float().masked_fill(~cand, 0.0)
    top = s.amax(dim=-1, keepdim=True).clamp_min(_TINY)
    step = 2.0**-_WEIGHT_BITS
    return (s / top / step).round().clamp_min(1.0) * step


@register
@dataclass
class VaSEPolicy(BasePolicy):
    """VaSE (Chang, Fu, Fu, Yang, Thomason, Jia, 2026, "Value-Aware Stochastic KV Cache Eviction for
    Reasoning Models", arXiv:2606.03928), as the Random Attention paper's section 2 states it.

    Per KV head: the n_large = `large` x K candidates whose value vectors have the largest range
    (`value_range`) are kept; the rest of the budget is a sample without replacement with
    probability proportional to the SnapKV score (window attention, GQA-averaged, max-pooled over
    `kernel`; on a grid of 2^-12 of the head's largest, `grid_weights`), drawn from the round's
    seeded generator. As priorities: the large-range entries
    rank above every other (1 + their range > 0), the others by their sampling key (<= 0), so the
    runtime's top K is exactly that set whatever the number of protected entries.
    """

    name = "vase"

    large: float = float_knob(0.25, 0.0, 1.0, " (fraction of K kept by value range)")
    kernel: int = knob(7, odd_kernel)

    def scores(self, view: LayerView) -> torch.Tensor:
        cand = view.candidates  # the recent buffer (recent-buffer framework) is kept anyway
        n_large = min(int(self.large * view.budget), view.n_entries)
        # Rounded as KNorm rounds key norms: a token repeated in layer 0 has equal values, so its
        # copies tie exactly and the same ones rank first in batched and solo runs.
        rng = round_relative(value_range(view.values)).masked_fill(~cand, float("-inf"))
        top = rng.topk(n_large, dim=-1).indices if n_large else rng.new_zeros((*rng.shape[:2], 0)).long()
        is_large = torch.zeros(rng.shape, dtype=torch.bool, device=rng.device).scatter_(-1, top, True) & cand
        keys = sampling_keys(grid_weights(snapkv_scores(view, self.kernel), cand), view.generator).float()
        return torch.where(is_large, 1.0 + rng.clamp_min(0.0), keys)
