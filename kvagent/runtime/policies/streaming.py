"""StreamingLLM: attention sinks plus the most recent entries."""

from dataclasses import dataclass

import torch

from kvagent.runtime.policies._args import int_knob
from kvagent.runtime.policies.base import BasePolicy, LayerView, register


@register
@dataclass
class StreamingPolicy(BasePolicy):
    """StreamingLLM (Xiao et al., 2023, "Efficient Streaming Language Models with Attention Sinks").

    Keeps the first `sink` logical positions whatever `protect` says, then the newest entries.
    """

    name = "streaming"

    sink: int = int_knob(4, 0)

    def scores(self, view: LayerView) -> torch.Tensor:
        pos = view.positions.to(torch.float32)
        return torch.where(view.positions < self.sink, torch.full_like(pos, float("inf")), pos)
