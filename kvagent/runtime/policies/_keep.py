"""Soft forced keeps for token policies (SnapKV's window, H2O's and TriAttention's newest entries)."""

from __future__ import annotations

import torch


def rank_first(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Lift the masked entries above every other entry of their head, keeping their own order.

    Not +inf: the runtime gives protected entries +inf, and when protected + forced entries exceed
    the budget, a tie at +inf would let top-K drop protected ones. Finite lifted scores always
    lose to protection and still beat every unforced entry.
    """
    finite = scores.masked_fill(~torch.isfinite(scores), 0.0)
    span = finite.amax(dim=-1, keepdim=True) - finite.amin(dim=-1, keepdim=True)
    return torch.where(mask, scores + span + 1.0, scores)


def rank_newest_first(scores: torch.Tensor, n: int) -> torch.Tensor:
    """`rank_first` of each head's newest `n` entries: a policy's own recency keep (its knob, not
    the runtime's recent buffer). Positions ascend along N, so they are the last n."""
    if n <= 0:
        return scores
    newest = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    newest[..., -n:] = True
    return rank_first(scores, newest)
