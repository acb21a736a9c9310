"""Random Attention: i.i.d. uniform keep priorities, drawn afresh per KV head per round."""

import torch

from kvagent.runtime.policies.base import BasePolicy, LayerView, register


@register
class RandomPolicy(BasePolicy):
    """Random Attention (uniform random eviction per head; with protect=prompt, the whole method).

    `shared=True` draws one score vector for all heads of a layer: the paper's control that removes
    cross-head diversity.
    """

    name = "random"

    def __init__(self, shared: bool = False) -> None:
        self.shared_across_heads = bool(shared)

    def scores(self, view: LayerView) -> torch.Tensor:
        b, h, n = view.positions.shape
        heads = 1 if self.shared_across_heads else h
        # Draw on CPU with the seeded generator so keep-sets do not depend on the device.
        u = torch.rand((b, heads, n), generator=view.generator)
        return u.to(view.keys.device)
