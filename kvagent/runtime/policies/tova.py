"""TOVA: keep the entries the newest query attends to."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvagent.runtime.policies._args import bool_knob
from kvagent.runtime.policies._attn import window_attention
from kvagent.runtime.policies.base import BasePolicy, LayerView, register


@register
@dataclass
class TOVAPolicy(BasePolicy):
    """TOVA (Oren, Hassid, Yarden, Adi, Schwartz, 2024, "Transformers are Multi-State RNNs",
    arXiv:2401.06104).

    Score = softmax attention of the LAST query only (the newest token), averaged over query
    heads. `shared=True` (default, as in the paper's code) averages over every query head of the
    layer and keeps one set for all KV heads; `shared=False` averages per GQA group, one set per
    KV head. Nothing is forced: the newest token usually attends to itself strongly.
    """

    name = "tova"
    adaptive_heads = True  # attention mass: comparable across heads (Ada-KV)

    shared: bool = bool_knob(True)

    @property
    def shared_across_heads(self) -> bool:
        return self.shared

    def scores(self, view: LayerView) -> torch.Tensor:
        b, hkv, n = view.positions.shape
        heads = 1 if self.shared_across_heads else hkv
        if view.queries.shape[2] == 0:
            return torch.zeros((b, heads, n), dtype=torch.float32, device=view.keys.device)
        probs = window_attention(
            view.queries[:, :, -1:],
            view.query_positions[-1:],
            view.keys,
            view.positions,
            view.group_size,
            view.scaling,
        )[:, :, 0]  # (B, H_q, N)
        if self.shared_across_heads:
            # One keep-set per layer from the start, so entry n holds the same position in every head.
            return probs.mean(dim=1, keepdim=True)
        return probs.reshape(b, hkv, view.group_size, n).mean(dim=2)
