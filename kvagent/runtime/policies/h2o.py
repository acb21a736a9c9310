"""H2O: keep the heavy hitters, the entries with the most accumulated attention."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvagent.runtime.policies._args import float_arg, recency_knob
from kvagent.runtime.policies._attn import group_sum_attention
from kvagent.runtime.policies._keep import rank_newest_first
from kvagent.runtime.policies.base import BasePolicy, LayerView, own_recency, register


@register
@dataclass
class H2OPolicy(BasePolicy):
    """H2O (Zhang et al., 2023, "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of LLMs").

    Score = attention each entry has received since it entered the cache, summed over the
    query heads of its GQA group. Exact without attention weights from the kernel: the runtime
    keeps every query since the last round (or absorb); their softmax rows, causal by logical
    position, are recomputed here over the current entries. Nothing was evicted in between, so
    the denominators are exactly the kernel's. The sum lives in state["per_entry"]["acc"],
    which the runtime gathers at compaction and zero-pads for new entries.

    `recent` (fraction of the budget, paper default 0.5) ranks the newest entries per head first:
    without it fresh entries, which have had few queries, would always lose to old ones. None
    (default) leaves it to the framework: 0.5 under topk-all, 0 under recent-buffer, whose recent
    buffer keeps the newest r entries outside the budget instead.
    """

    name = "h2o"
    adaptive_heads = True  # attention mass: comparable across heads (Ada-KV)
    needs_pending_queries = True

    recent: float | None = recency_knob(float_arg, lo=0.0, hi=1.0, hint=" (fraction of the budget)")

    def absorb(self, view: LayerView) -> None:
        """Add the pending queries' attention rows to the accumulated score."""
        acc = self._acc(view)
        q, qpos = view.pending_queries, view.pending_positions
        if q is None or q.shape[2] == 0:
            return
        if qpos is None or qpos.shape[0] != q.shape[2]:
            raise ValueError("h2o: pending_positions must give one logical position per pending query")
        acc += group_sum_attention(q, qpos, view.keys, view.positions, view.group_size, view.scaling)

    def scores(self, view: LayerView) -> torch.Tensor:
        self.absorb(view)
        s = self._acc(view).clone()
        share = own_recency(self.recent, 0.5, 0.0, view)
        return rank_newest_first(s, min(int(share * view.budget), s.shape[-1]))

    @staticmethod
    def _acc(view: LayerView) -> torch.Tensor:
        per_entry = view.state.setdefault("per_entry", {})
        acc = per_entry.get("acc")
        shape = view.positions.shape
        if acc is None:
            acc = torch.zeros(shape, dtype=torch.float32, device=view.keys.device)
            per_entry["acc"] = acc
        elif acc.shape != shape:
            raise ValueError(
                f"h2o: state acc has shape {tuple(acc.shape)} but the cache has {tuple(shape)}; "
                "the runtime must gather and pad state['per_entry'] with the cache"
            )
        return acc
