"""KNorm: keep the keys with the smallest L2 norm."""

from __future__ import annotations

import torch

from kvagent.runtime.policies._args import reject_unknown
from kvagent.runtime.policies.base import BasePolicy, LayerView, register


@register
class KNormPolicy(BasePolicy):
    """KNorm (Devoto, Zhao, Scardapane, Minervini, 2024, "A Simple and Effective L2 Norm-Based
    Strategy for KV Cache Compression", arXiv:2406.11430).

    Score = -||k||_2 per KV head: the paper finds low-norm keys draw high attention, so the
    smallest norms are kept first. No knobs; needs no queries.
    """

    name = "knorm"

    def __init__(self, **unknown) -> None:
        reject_unknown(self.name, unknown, [])

    def scores(self, view: LayerView) -> torch.Tensor:
        return -view.keys.float().norm(dim=-1)
