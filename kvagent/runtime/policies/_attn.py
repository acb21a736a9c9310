"""Attention probabilities of window queries over the cache, shared by the scoring policies.

Recomputed from post-RoPE queries and keys, in float32, with the GQA mapping (query head h reads
kv head h // group_size) and causal masking by LOGICAL position: a query at position p attends
only keys with position <= p. That is exactly the set the kernel attended when the query ran,
provided nothing was evicted since (the cache only grows between rounds).
"""

from __future__ import annotations

import torch

# Bound on the float32 logits materialised at once (B*H_q*rows*N), ~256 MiB: H2O's pending
# queries after a long prefill chunk can number in the thousands.
_MAX_ELEMS = 1 << 26


def window_attention(
    queries: torch.Tensor,
    query_positions: torch.Tensor,
    keys: torch.Tensor,
    positions: torch.Tensor,
    group_size: int,
    scaling: float,
) -> torch.Tensor:
    """Softmax rows (B, H_q, W, N) in float32; rows that see no key are all zero.

    queries (B, H_q, W, D), query_positions (W,), keys (B, H_kv, N, D), positions (B, H_kv, N).
    """
    b, hq, w, d = queries.shape
    hkv, n = keys.shape[1], keys.shape[2]
    if hq != hkv * group_size:
        raise ValueError(f"window_attention: H_q={hq} != H_kv={hkv} * group_size={group_size}")
    # (B, H_kv, g*W, N): each kv head's keys against its group's queries.
    logits = queries.float().reshape(b, hkv, group_size * w, d) @ keys.float().transpose(-1, -2)
    logits = logits.view(b, hkv, group_size, w, n)
    qpos = query_positions.to(positions.device).reshape(1, 1, 1, w, 1)
    pos = positions.reshape(b, hkv, 1, 1, n)
    # PAD entries (position -1, after Session.forget) are seen by no query.
    logits.masked_fill_((pos > qpos) | (pos < 0), float("-inf"))
    # Softmax in place (these tensors are the largest a round makes). A row with no visible key
    # (impossible in a consistent cache) ends all zero instead of NaN: the max is floored to a
    # finite value, exp gives 0 everywhere, and the sum is floored.
    m = logits.amax(dim=-1, keepdim=True).clamp_min_(torch.finfo(torch.float32).min)
    probs = logits.sub_(m).mul_(scaling).exp_()
    probs.div_(probs.sum(dim=-1, keepdim=True).clamp_min_(torch.finfo(torch.float32).tiny))
    return probs.reshape(b, hq, w, n)


def group_sum_attention(
    queries: torch.Tensor,
    query_positions: torch.Tensor,
    keys: torch.Tensor,
    positions: torch.Tensor,
    group_size: int,
    scaling: float,
) -> torch.Tensor:
    """(B, H_kv, N): attention each entry receives, summed over all queries and the group's heads.

    Chunked over queries so memory stays bounded whatever the number of queries.
    """
    b, hq, m, _ = queries.shape
    hkv, n = keys.shape[1], keys.shape[2]
    out = torch.zeros((b, hkv, n), dtype=torch.float32, device=keys.device)
    step = max(1, _MAX_ELEMS // max(1, b * hq * n))
    for s in range(0, m, step):
        p = window_attention(
            queries[:, :, s : s + step], query_positions[s : s + step], keys, positions, group_size, scaling
        )
        out += p.reshape(b, hkv, group_size, -1, n).sum(dim=(2, 3))
    return out
