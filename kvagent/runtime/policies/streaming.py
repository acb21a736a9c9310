"""StreamingLLM: attention sinks plus the most recent entries."""

import torch

from kvagent.runtime.policies.base import BasePolicy, LayerView, register


@register
class StreamingPolicy(BasePolicy):
    """StreamingLLM (Xiao et al., 2023, "Efficient Streaming Language Models with Attention Sinks").

    Keeps the first `sink` logical positions whatever `protect` says, then the newest entries.
    """

    name = "streaming"

    def __init__(self, sink: int = 4) -> None:
        if sink < 0:
            from kvagent.errors import ConfigError

            raise ConfigError(f"policy_args.sink: must be >= 0, got {sink}")
        self.sink = int(sink)

    def scores(self, view: LayerView) -> torch.Tensor:
        pos = view.positions.to(torch.float32)
        return torch.where(view.positions < self.sink, torch.full_like(pos, float("inf")), pos)
