"""KNorm: keep the keys with the smallest L2 norm."""

from __future__ import annotations

import torch

from kvagent.runtime.policies.base import BasePolicy, LayerView, register


def round_relative(x: torch.Tensor, bits: int = 12) -> torch.Tensor:
    """x rounded to `bits` significant bits (relative step 2^-bits, ~2.4e-4 for 12).

    Why: a token repeated at several positions has exactly equal key norms in layer 0 (RoPE keeps
    norms), so its copies tie, and float noise (a batched forward rounds differently from a solo
    one) would break the tie differently in different runs. Rounded, the copies tie exactly and
    top-K picks the same ones every time.
    """
    mantissa, exponent = torch.frexp(x)
    return torch.ldexp(torch.round(mantissa * 2**bits) / 2**bits, exponent)


@register
class KNormPolicy(BasePolicy):
    """KNorm (Devoto, Zhao, Scardapane, Minervini, 2024, "A Simple and Effective L2 Norm-Based
    Strategy for KV Cache Compression", arXiv:2406.11430).

    Score = -||k||_2 per KV head, compared at ~2.4e-4 relative precision (`round_relative`): the
    paper finds low-norm keys draw high attention, so the smallest norms are kept first. No
    knobs; needs no queries.
    """

    name = "knorm"

    def scores(self, view: LayerView) -> torch.Tensor:
        return -round_relative(view.keys.float().norm(dim=-1))
