"""Random Attention: i.i.d. uniform keep priorities, drawn afresh per KV head per round."""

import torch

from kvagent.runtime.policies._args import bool_arg, reject_unknown
from kvagent.runtime.policies.base import BasePolicy, LayerView, register


@register
class RandomPolicy(BasePolicy):
    """Random Attention (uniform random eviction per KV head; with protect=prompt, the paper's whole method).

    Top-K of i.i.d. uniform scores is a uniformly random K-subset of the evictable entries, drawn
    independently per head, so heads cover different positions. `shared=True` draws one score
    vector for all heads of a layer: the paper's control that removes cross-head diversity.
    """

    name = "random"

    def __init__(self, shared: bool = False, **unknown) -> None:
        reject_unknown(self.name, unknown, ["shared"])
        self.shared_across_heads = bool_arg("shared", shared)

    def scores(self, view: LayerView) -> torch.Tensor:
        b, h, n = view.positions.shape
        heads = 1 if self.shared_across_heads else h
        # Draw on the generator's device (CPU in the runtime) so keep-sets do not depend on the GPU.
        g = view.generator
        u = torch.rand((b, heads, n), generator=g, device=g.device)
        return u.to(view.keys.device)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shared={self.shared_across_heads})"
