"""PyramidKV: SnapKV scores under a budget that shrinks linearly with depth."""

from __future__ import annotations

from dataclasses import dataclass

from kvagent.runtime.policies._args import float_knob, int_knob
from kvagent.runtime.policies.base import register
from kvagent.runtime.policies.snapkv import SnapKVPolicy


@register
@dataclass
class PyramidKVPolicy(SnapKVPolicy):
    """PyramidKV (Cai et al., 2024, "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling").

    Lower layers attend broadly, upper layers narrowly, so budgets form an arithmetic sequence
    from `2K - K_min` (layer 0) down to `K_min = max(min_budget, K // beta)` (last layer); the
    total is exactly `K * n_layers`. `beta=1` gives uniform budgets. Scores are SnapKV's.
    """

    name = "pyramidkv"

    beta: float = float_knob(20.0, lo=1.0, hint=" (1 = uniform budgets)")
    min_budget: int = int_knob(16, 1)

    def layer_budgets(self, budget: int, n_layers: int) -> list[int]:
        budget, n_layers = int(budget), int(n_layers)
        if n_layers < 1:
            raise ValueError(f"layer_budgets: n_layers must be >= 1, got {n_layers}")
        # The smallest layer keeps at least min_budget, but never more than the uniform share.
        k_min = min(budget, max(self.min_budget, int(budget / self.beta)))
        k_max = 2 * budget - k_min
        if n_layers == 1 or k_max == k_min:
            return [budget] * n_layers
        span, last = k_max - k_min, n_layers - 1
        # Integer arithmetic: floor of the exact linear sequence, then hand the remainder (< n_layers)
        # to the first layers one each, which keeps the sequence non-increasing and the sum exact.
        out = [k_max - (span * i + last - 1) // last for i in range(n_layers)]
        rem = budget * n_layers - sum(out)
        for i in range(rem):
            out[i] += 1
        return out
