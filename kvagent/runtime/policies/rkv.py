"""R-KV: window attention importance minus key redundancy, for long reasoning traces."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvagent.runtime.policies._args import bool_arg, float_knob, knob, odd_kernel, recency_knob
from kvagent.runtime.policies._keep import rank_first
from kvagent.runtime.policies.base import BasePolicy, LayerView, own_recency, register
from kvagent.runtime.policies.snapkv import window_mask

# Bound on the float32 similarity rows materialised at once (B*H_kv*rows*N), as in _attn.
_MAX_ELEMS = 1 << 26


def importance(view: LayerView, kernel: int) -> torch.Tensor:
    """(B, H_kv, N): window attention with the GQA group's logits max-pooled before the softmax
    (R-KV's form), averaged over the window queries, then max-pooled over `kernel` entries."""
    b, hkv, n = view.positions.shape
    q = view.queries
    w = q.shape[2]
    if w == 0:
        return torch.zeros((b, hkv, n), dtype=torch.float32, device=view.keys.device)
    g, d = view.group_size, q.shape[-1]
    logits = q.float().reshape(b, hkv, g * w, d) @ view.keys.float().transpose(-1, -2)
    logits = logits.view(b, hkv, g, w, n).amax(dim=2)  # (B, H_kv, W, N)
    qpos = view.query_positions.to(view.positions.device).reshape(1, 1, w, 1)
    pos = view.positions.unsqueeze(2)
    logits.masked_fill_((pos > qpos) | (pos < 0), float("-inf"))  # future and PAD entries
    probs = torch.softmax(logits * view.scaling, dim=-1).nan_to_num_(0.0)  # rows seeing no key: 0
    s = probs.mean(dim=2)
    if kernel > 1:
        s = F.max_pool1d(s.reshape(b * hkv, 1, n), kernel, stride=1, padding=kernel // 2).reshape(b, hkv, n)
    return s


def redundancy(keys: torch.Tensor, threshold: float) -> torch.Tensor:
    """(B, H_kv, N): R-KV's redundancy, a softmax over entries of their mean cosine similarity to
    the other keys of the head. For each key i, its most recent neighbour with similarity above
    `threshold` is exempted (that entry of row i is dropped), so of a run of near-duplicates the
    newest copy scores least redundant and survives.

    The column sums are linear in the keys (sum_i cos(i, j) = k_j . sum_i k_i for unit keys);
    only the exemptions need the pairwise similarities, searched in row chunks to bound memory.
    """
    b, h, n, _ = keys.shape
    kn = F.normalize(keys.float(), dim=-1)
    col_sum = (kn * kn.sum(dim=2, keepdim=True)).sum(dim=-1) - (kn * kn).sum(dim=-1)  # minus self
    rev = kn.flip(2)  # columns newest first, so a row's first hit is its newest similar key
    step = max(1, _MAX_ELEMS // max(1, b * h * n))
    for s in range(0, n, step):
        r = min(step, n - s)
        sim = kn[:, :, s : s + r] @ rev.transpose(-1, -2)  # (B, H, r, N), reversed columns
        rows = torch.arange(r, device=keys.device)
        sim[:, :, rows, (n - 1 - s) - rows] = -2.0  # never one's own twin
        first = (sim > threshold).view(torch.uint8).argmax(dim=-1, keepdim=True)
        val = sim.gather(-1, first)
        val = val.masked_fill_(val <= threshold, 0.0).squeeze(-1)  # rows without a similar key
        col_sum.scatter_add_(-1, (n - 1) - first.squeeze(-1), -val)
    return torch.softmax(col_sum / n, dim=-1)


@register
@dataclass
class RKVPolicy(BasePolicy):
    """R-KV (Cai, Xiao, Sun, Luo, Zhang, Wan, Li, Zhou, Chang, Gu, Dong, Anandkumar, Asi, Hu, 2025,
    "R-KV: Redundancy-aware KV Cache Compression for Reasoning Models", arXiv:2505.24133).

    Score = lam * importance - (1 - lam) * redundancy per KV head (see the two functions above);
    `lam` = 0.1 (paper default), `threshold` = 0.5 and `kernel` = 7 (the authors' code). With
    `keep_window` the window's own entries rank above all others; None (default) leaves it to the
    framework: on under topk-all (the paper's observation window), off under recent-buffer. Differences from the authors' code: the attention softmax runs over every
    visible entry (theirs leaves the window's own keys out) and the window is the runtime's W
    (theirs: 8 tokens).
    """

    name = "rkv"
    adaptive_heads = True  # attention and redundancy distributions per head: comparable (Ada-KV)

    lam: float = float_knob(0.1, 0.0, 1.0, " (1 = attention only, 0 = redundancy only)")
    threshold: float = float_knob(0.5, -1.0, 1.0, " (a cosine similarity)")
    kernel: int = knob(7, odd_kernel)
    keep_window: bool | None = recency_knob(bool_arg)

    def scores(self, view: LayerView) -> torch.Tensor:
        s = self.lam * importance(view, self.kernel)
        if self.lam < 1.0:
            s = s - (1.0 - self.lam) * redundancy(view.keys, self.threshold)
        if own_recency(self.keep_window, True, False, view):
            s = rank_first(s, window_mask(view))
        return s
