"""PyramidKV: SnapKV scores under per-layer budgets that shrink arithmetically with depth."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from fractions import Fraction

import torch

from kvagent.runtime.policies._args import float_knob, int_knob
from kvagent.runtime.policies.base import LayerView, register
from kvagent.runtime.policies.snapkv import SnapKVPolicy

SCHEDULE = "paper"  # what `bench fidelity` records for this policy's layer budgets


def pyramid_budgets(budget: int, n_layers: int, beta: float, window: int, min_budget: int = 1) -> list[int]:
    """Per-layer K for PyramidKV (Cai et al. 2024, arXiv:2406.02069, "KV cache size allocation").

    Every layer keeps the `window` observation-window tokens (the paper's alpha instruction
    tokens, retained in all layers); the rest of the layer-average budget, k = budget - window,
    is split arithmetically over depth: the top layer gets k / beta, the bottom layer
    2k - k / beta, the layers between lie on the line joining them, so the split sums to
    k * n_layers. `min_budget` (not in the paper; 1 by default) raises the top of the line so
    that no layer keeps fewer entries; the bottom comes down by as much. Integers by largest
    remainder (each layer within one entry of its exact share, ties to the lower layer, so the
    sequence stays non-increasing); the total is exactly budget * n_layers. Uniform: beta = 1,
    one layer, a window that leaves nothing to split (budget <= window), or a floor above K.
    """
    budget, n_layers = int(budget), int(n_layers)
    if n_layers < 1:
        raise ValueError(f"layer_budgets: n_layers must be >= 1, got {n_layers}")
    split = budget - window
    k, last = Fraction(split), n_layers - 1
    top = max(k / Fraction(beta), Fraction(min_budget - window))
    if n_layers == 1 or split <= 0 or top >= k:
        return [budget] * n_layers
    bottom = 2 * k - top
    exact = [bottom - (bottom - top) * i / last for i in range(n_layers)]
    out = [int(x) for x in exact]  # floors (all exact shares are >= 0)
    short = split * n_layers - sum(out)
    by_remainder = sorted(range(n_layers), key=lambda i: (-(exact[i] - out[i]), i))
    for i in by_remainder[:short]:
        out[i] += 1
    return [window + x for x in out]


def _warn_window(reserved: int, seen: int) -> None:
    warnings.warn(
        f"pyramidkv: the runtime's window holds {seen} queries but each layer reserves {reserved} for "
        f"it; set policy_args window={seen} (the CacheConfig window) so every layer keeps its window",
        stacklevel=3,  # shown once per place by Python's default warning filter
    )


@register
@dataclass
class PyramidKVPolicy(SnapKVPolicy):
    """PyramidKV (Cai et al., 2024, "PyramidKV: Dynamic KV Cache Compression based on Pyramidal
    Information Funneling", arXiv:2406.02069).

    Lower layers attend broadly, upper layers narrowly, so each layer's K follows the paper's
    arithmetic schedule (`pyramid_budgets`): every layer keeps its `window` observation tokens,
    and the remaining K - window per layer is split from (2 - 1/beta)(K - window) at layer 0 down
    to (K - window) / beta at the top (`min_budget` floors every layer's K; default 1, the paper).
    Total kept: exactly K * n_layers. Scores are SnapKV's.

    `window` is CacheConfig.window: the policy contract gives `layer_budgets` no window, so it
    is a knob the session fills from the cache config (`model_args`) unless policy_args sets it;
    a round that keeps the window (`keep_window`, topk-all) and sees more window queries than it
    reserves warns once. Under recent-buffer the window is not ranked first (the recent buffer
    keeps the newest entries), and the reservation stays as the schedule's floor.
    """

    name = "pyramidkv"
    schedule = SCHEDULE
    model_args = ("window",)

    beta: float = float_knob(20.0, lo=1.0, hint=" (1 = uniform budgets)")
    window: int = int_knob(16, 0)
    min_budget: int = int_knob(1, 1)

    def layer_budgets(self, budget: int, n_layers: int) -> list[int]:
        return pyramid_budgets(budget, n_layers, self.beta, self.window, self.min_budget)

    def scores(self, view: LayerView) -> torch.Tensor:
        seen = view.queries.shape[2]
        if self.keeps_window(view) and seen > self.window:
            _warn_window(self.window, seen)
        return super().scores(view)
