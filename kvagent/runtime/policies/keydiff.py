"""KeyDiff: keep the keys least similar to the layer's mean key direction."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvagent.runtime.policies.base import BasePolicy, LayerView, register


@register
class KeyDiffPolicy(BasePolicy):
    """KeyDiff (Park, Jones, Morse, Goel, Lee, Lott, 2025, "KeyDiff: Key Similarity-Based KV Cache
    Eviction for Long-Context LLM Inference in Resource-Constrained Environments",
    arXiv:2504.15364).

    Score = -cos(k_j, a) per KV head, with anchor a = mean of the head's unit-normalised cached
    keys: distinctive keys survive, keys pointing the common way go first. No knobs; needs no
    queries. (The paper evicts block by block while prefilling; here every round scores the
    whole cache, which is what its per-block step does to the block in hand.)
    """

    name = "keydiff"

    def scores(self, view: LayerView) -> torch.Tensor:
        k = F.normalize(view.keys.float(), dim=-1)
        anchor = k.mean(dim=-2, keepdim=True)
        return -F.cosine_similarity(k, anchor, dim=-1)
