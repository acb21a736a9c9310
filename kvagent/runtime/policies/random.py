"""Random Attention: i.i.d. uniform keep priorities, drawn afresh per KV head per round."""

from dataclasses import dataclass

import torch

from kvagent.runtime.policies._args import bool_knob
from kvagent.runtime.policies.base import BasePolicy, LayerView, register


@register
@dataclass
class RandomPolicy(BasePolicy):
    """Random Attention (uniform random eviction per KV head; with protect=prompt, the paper's whole method).

    Top-K of i.i.d. uniform scores is a uniformly random K-subset of the evictable entries, drawn
    independently per head, so heads cover different positions. `shared=True` draws one score
    vector for all heads of a layer: the paper's control that removes cross-head diversity.
    """

    name = "random"

    shared: bool = bool_knob(False)

    @property
    def shared_across_heads(self) -> bool:
        return self.shared

    def scores(self, view: LayerView) -> torch.Tensor:
        b, h, n = view.positions.shape
        heads = 1 if self.shared_across_heads else h
        # The generator is on the cache's device (round.round_generator): no host copy in a round.
        g = view.generator
        return torch.rand((b, heads, n), generator=g, device=g.device)
