"""MorphKV: keep the older entries that the window tokens' attention profiles point at."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvagent.errors import ConfigError
from kvagent.runtime.policies._args import bool_arg, knob, recency_knob
from kvagent.runtime.policies._keep import rank_first
from kvagent.runtime.policies.base import BasePolicy, LayerView, own_recency, register
from kvagent.runtime.policies.snapkv import window_mask

FUSIONS = ("max", "sum")


def fusion_arg(name: str, value: Any) -> str:
    if value not in FUSIONS:
        raise ConfigError(f"policy_args.{name}: must be one of {', '.join(FUSIONS)}, got {value!r}")
    return value


def window_profiles(view: LayerView) -> torch.Tensor:
    """(B, H_kv, W, N): each window query's attention profile over the entries older than the
    window, per KV head. The GQA group's logits are summed before the softmax (one profile per
    KV head, as the authors' code fuses a group), and the softmax runs over the older entries
    only: the window's own entries are kept anyway, so the profile says how a window token spreads
    its attention over what may be evicted. Rows that see no older entry are all zero."""
    b, hkv, n = view.positions.shape
    q, w = view.queries, view.queries.shape[2]
    g, d = view.group_size, q.shape[-1]
    logits = q.float().reshape(b, hkv, g, w, d).sum(dim=2) @ view.keys.float().transpose(-1, -2)
    qpos = view.query_positions.to(view.positions.device).reshape(1, 1, w, 1)
    pos = view.positions.unsqueeze(2)
    first = view.query_positions.min().to(pos.device)
    # Future entries, PAD (-1) and the window's own entries are not candidates.
    hidden = (pos > qpos) | (pos < 0) | (pos >= first)
    logits = (logits * view.scaling).masked_fill_(hidden, float("-inf"))
    return torch.softmax(logits, dim=-1).nan_to_num_(0.0)


@register
@dataclass
class MorphKVPolicy(BasePolicy):
    """MorphKV (Ghadia, Kumar, Jain, Nair, Das, 2025, "Dialogue Without Limits: Constant-Sized KV
    Caches for Extended Responses in LLMs", arXiv:2503.00979).

    The cache holds the window plus the older entries the window's tokens attend to: each of
    the W window queries gives an attention profile over the older entries (`window_profiles`),
    the profiles are fused per entry by `fusion` (max: kept if any window token attends to it
    strongly, the paper's long-response setting; sum: total attention), and with `keep_window`
    the window's own entries rank first (None, the default, leaves it to the framework: on under
    topk-all, off under recent-buffer, whose recent buffer keeps the newest entries). Per KV head. The cache size is the runtime's: K after each round, so it
    stays constant; the paper re-selects after every generated token, which is `buffer=1` here
    (a larger buffer re-selects every r tokens).
    """

    name = "morphkv"

    fusion: str = knob("max", fusion_arg)
    keep_window: bool | None = recency_knob(bool_arg)

    def scores(self, view: LayerView) -> torch.Tensor:
        b, hkv, n = view.positions.shape
        if view.queries.shape[2] == 0:
            return torch.zeros((b, hkv, n), dtype=torch.float32, device=view.keys.device)
        profiles = window_profiles(view)
        s = profiles.amax(dim=2) if self.fusion == "max" else profiles.sum(dim=2)
        if own_recency(self.keep_window, True, False, view):
            s = rank_first(s, window_mask(view))
        return s
