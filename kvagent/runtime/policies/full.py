"""Full attention: the dense reference. Never evicts."""

import torch

from kvagent.runtime.policies.base import BasePolicy, LayerView, register


@register
class FullPolicy(BasePolicy):
    """Keeps every entry; the runtime never schedules a round for it."""

    name = "full"

    def scores(self, view: LayerView) -> torch.Tensor:
        return torch.full(view.positions.shape, float("inf"), device=view.keys.device)
