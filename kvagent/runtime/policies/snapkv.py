"""SnapKV: keep the entries the most recent queries attend to."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvagent.runtime.policies._args import bool_arg, knob, odd_kernel, recency_knob
from kvagent.runtime.policies._attn import window_attention
from kvagent.runtime.policies._keep import rank_first
from kvagent.runtime.policies.base import BasePolicy, LayerView, own_recency, register


def snapkv_scores(view: LayerView, kernel: int) -> torch.Tensor:
    """(B, H_kv, N): window attention averaged over the W queries and the GQA group, max-pooled."""
    b, hkv, n = view.positions.shape
    if view.queries.shape[2] == 0:
        return torch.zeros((b, hkv, n), dtype=torch.float32, device=view.keys.device)
    probs = window_attention(
        view.queries, view.query_positions, view.keys, view.positions, view.group_size, view.scaling
    )
    s = probs.mean(dim=2).reshape(b, hkv, view.group_size, n).mean(dim=2)
    if kernel > 1:
        # Keep neighbours of attended entries too: a fact spans several tokens. Padding is -inf
        # in max_pool1d, so edges are not biased.
        s = F.max_pool1d(s.reshape(b * hkv, 1, n), kernel, stride=1, padding=kernel // 2)
        s = s.reshape(b, hkv, n)
    return s


def window_mask(view: LayerView) -> torch.Tensor:
    """(B, H_kv, N) bool: entries belonging to the observation window (position >= first query)."""
    if view.queries.shape[2] == 0:
        return torch.zeros(view.positions.shape, dtype=torch.bool, device=view.positions.device)
    first = view.query_positions.min().to(view.positions.device)
    return view.positions >= first


@register
@dataclass
class SnapKVPolicy(BasePolicy):
    """SnapKV (Li et al., 2024, "SnapKV: LLM Knows What You are Looking for Before Generation").

    Score per KV head = attention of the last W queries, averaged over the queries and over the
    query heads of the GQA group, max-pooled over `kernel` neighbouring entries. With
    `keep_window` the window's own entries rank above all others; None (default) leaves it to the
    framework: on under topk-all (as in the paper), off under recent-buffer, whose recent buffer
    keeps the newest entries for every policy alike.
    """

    name = "snapkv"
    adaptive_heads = True  # attention mass: comparable across heads (Ada-KV)

    kernel: int = knob(7, odd_kernel)
    keep_window: bool | None = recency_knob(bool_arg)

    def keeps_window(self, view: LayerView) -> bool:
        return own_recency(self.keep_window, True, False, view)

    def scores(self, view: LayerView) -> torch.Tensor:
        s = snapkv_scores(view, self.kernel)
        if self.keeps_window(view):
            s = rank_first(s, window_mask(view))
        return s
