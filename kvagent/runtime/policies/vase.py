"""VaSE: keep the largest-range value states, sample the rest in proportion to SnapKV's score."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvagent.runtime.policies._args import float_knob, knob, odd_kernel
from kvagent.runtime.policies.base import BasePolicy, LayerView, register
from kvagent.runtime.policies.snapkv import snapkv_scores

_TINY = 1e-30  # floor on sampling weights: a zero weight still gets a finite, lowest key


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


@register
@dataclass
class VaSEPolicy(BasePolicy):
    """VaSE (Chang, Fu, Fu, Yang, Thomason, Jia, 2026, "Value-Aware Stochastic KV Cache Eviction for
    Reasoning Models", arXiv:2606.03928), as the Random Attention paper's section 2 states it.

    Per KV head: the n_large = `large` x K candidates whose value vectors have the largest range
    (`value_range`) are kept; the rest of the budget is a sample without replacement with
    probability proportional to the SnapKV score (window attention, GQA-averaged, max-pooled over
    `kernel`), drawn from the round's seeded generator. As priorities: the large-range entries
    rank above every other (1 + their range > 0), the others by their sampling key (<= 0), so the
    runtime's top K is exactly that set whatever the number of protected entries.
    """

    name = "vase"

    large: float = float_knob(0.25, 0.0, 1.0, " (fraction of K kept by value range)")
    kernel: int = knob(7, odd_kernel)

    def scores(self, view: LayerView) -> torch.Tensor:
        cand = view.candidates  # the recent buffer (recent-buffer framework) is kept anyway
        n_large = min(int(self.large * view.budget), view.n_entries)
        rng = value_range(view.values).masked_fill(~cand, float("-inf"))
        top = rng.topk(n_large, dim=-1).indices if n_large else rng.new_zeros((*rng.shape[:2], 0)).long()
        is_large = torch.zeros(rng.shape, dtype=torch.bool, device=rng.device).scatter_(-1, top, True) & cand
        keys = sampling_keys(snapkv_scores(view, self.kernel), view.generator).float()
        return torch.where(is_large, 1.0 + rng.clamp_min(0.0), keys)
