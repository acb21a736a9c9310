"""Audit analyses of the Random Attention paper (App. D), from the runtime's per-round records.

Each eviction round of each layer yields one `AuditRound`: which logical positions every KV head
still holds after the round. From a list of them:
- prompt survival: fraction of the prompt still held (by some head, and per head on average);
- survival by age: fraction of positions of a given age (logical_length - position) still held;
- cross-head coverage: fraction of all positions seen so far held by at least one head, against
  the per-head fraction. Per-head eviction (random) covers more than shared keep-sets do.
All functions return plain dicts of floats/lists (JSON-ready: undefined values and an open
upper band edge are None).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

DEFAULT_AGE_BANDS: tuple[float, ...] = (0, 256, 1024, 4096, math.inf)


@dataclass
class AuditRound:
    """What one layer holds after one eviction round (batch size 1)."""

    round: int
    layer: int
    logical_length: int  # tokens fed so far; positions seen are 0 .. logical_length - 1
    prompt_length: int  # protected-prompt positions 0 .. prompt_length - 1 (0 if none)
    kept: torch.Tensor  # (H_kv, N) logical positions held by each head after the round (-1: PAD)
    forced: bool = False  # a Session.forget / rewind drop rather than a policy round


def _kept(r: AuditRound) -> torch.Tensor:
    k = r.kept
    if k.dim() == 3:  # tolerate a leading batch dim of 1
        if k.shape[0] != 1:
            raise ValueError(f"audit: batch size must be 1, got kept of shape {tuple(k.shape)}")
        k = k[0]
    if k.dim() != 2:
        raise ValueError(f"audit: kept must be (H_kv, N), got shape {tuple(k.shape)}")
    return k.detach().to("cpu", torch.long)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def _last_per_layer(rounds: Sequence[AuditRound]) -> list[AuditRound]:
    last: dict[int, AuditRound] = {}
    for r in rounds:
        if r.layer not in last or r.round >= last[r.layer].round:
            last[r.layer] = r
    return [last[k] for k in sorted(last)]


def prompt_survival(rounds: Sequence[AuditRound]) -> dict:
    """Fraction of prompt positions held: by at least one head (`union`) and per head (`per_head`).

    `rows` has one entry per round with a prompt; `union`/`per_head` average them; `final`
    averages each layer's last round (what the model can still read at the end).
    """
    rows = []
    for r in rounds:
        p = int(r.prompt_length)
        if p <= 0:
            continue
        k = _kept(r)
        in_prompt = (k >= 0) & (k < p)  # kept positions are distinct within a head; -1 is PAD
        per_head = in_prompt.sum(dim=1).double().mean().item() / p
        union = torch.unique(k[in_prompt]).numel() / p
        rows.append({"round": r.round, "layer": r.layer, "union": union, "per_head": per_head})
    final = [row for row in rows if (row["round"], row["layer"]) in _keys(_last_per_layer(rounds))]
    return {
        "union": _mean([x["union"] for x in rows]),
        "per_head": _mean([x["per_head"] for x in rows]),
        "final_union": _mean([x["union"] for x in final]),
        "final_per_head": _mean([x["per_head"] for x in final]),
        "rows": rows,
    }


def _keys(rounds: Sequence[AuditRound]) -> set[tuple[int, int]]:
    return {(r.round, r.layer) for r in rounds}


def survival_by_age(
    rounds: Sequence[AuditRound],
    bands: Sequence[float] = DEFAULT_AGE_BANDS,
    exclude_prompt: bool = True,
) -> dict:
    """Fraction of positions of each age band still held, pooled over rounds and layers.

    Age = logical_length - position (the newest position has age 1). Band i is
    [bands[i], bands[i+1]). `per_head` = held by a head on average, `union` = held by any head;
    `count` = positions of that age that existed (the denominator, summed over records).
    With `exclude_prompt` (default) protected prompt positions are left out of both sides:
    they survive by rule and would mask the policy's own decay.
    """
    edges = [float(b) for b in bands]
    if len(edges) < 2 or any(lo >= hi for lo, hi in zip(edges, edges[1:], strict=False)):
        raise ValueError(f"audit: age bands must be >= 2 strictly increasing edges, got {list(bands)}")
    nb = len(edges) - 1
    # Ages are integers: band i holds ages ceil(edges[i]) .. ceil(edges[i+1]) - 1.
    finite = torch.tensor([math.ceil(e) if math.isfinite(e) else 2.0**62 for e in edges], dtype=torch.float64)
    held_head = torch.zeros(nb, dtype=torch.float64)
    held_union = torch.zeros(nb, dtype=torch.float64)
    count = torch.zeros(nb, dtype=torch.float64)
    for r in rounds:
        k = _kept(r)
        length = int(r.logical_length)
        first = min(int(r.prompt_length), length) if exclude_prompt else 0
        # Eligible positions first .. length-1 have ages 1 .. length - first.
        lo = finite[:-1].clamp(min=1)
        hi = (finite[1:] - 1).clamp(max=length - first)
        count += (hi - lo + 1).clamp(min=0)
        held_head += _band_counts(length - k[k >= first], finite, nb) / max(1, k.shape[0])
        held_union += _band_counts(length - torch.unique(k[k >= first]), finite, nb)
    return {
        "bands": [[edges[i], edges[i + 1] if math.isfinite(edges[i + 1]) else None] for i in range(nb)],
        "per_head": [_ratio(held_head[i].item(), count[i].item()) for i in range(nb)],
        "union": [_ratio(held_union[i].item(), count[i].item()) for i in range(nb)],
        "count": [int(c) for c in count.tolist()],
    }


def _band_counts(ages: torch.Tensor, edges: torch.Tensor, nb: int) -> torch.Tensor:
    band = torch.bucketize(ages.double(), edges, right=True) - 1  # edges[i] <= age < edges[i+1]
    band = band[(band >= 0) & (band < nb)]
    return torch.bincount(band, minlength=nb)[:nb].double()


def cross_head_coverage(rounds: Sequence[AuditRound]) -> dict:
    """Fraction of positions seen so far held by at least one head (`union`) vs by one head on
    average (`per_head`); `gain` = union / per_head (1 for shared keep-sets, up to H_kv)."""
    rows = []
    for r in rounds:
        length = int(r.logical_length)
        if length <= 0:
            continue
        k = _kept(r)
        real = k >= 0  # not PAD entries
        per_head = real.sum(dim=1).double().mean().item() / length
        union = torch.unique(k[real]).numel() / length
        rows.append(
            {
                "round": r.round,
                "layer": r.layer,
                "union": union,
                "per_head": per_head,
                "gain": _ratio(union, per_head),
            }
        )
    final_keys = _keys(_last_per_layer(rounds))
    final = [row for row in rows if (row["round"], row["layer"]) in final_keys]
    return {
        "union": _mean([x["union"] for x in rows]),
        "per_head": _mean([x["per_head"] for x in rows]),
        "gain": _mean([x["gain"] for x in rows]),
        "final_union": _mean([x["union"] for x in final]),
        "final_per_head": _mean([x["per_head"] for x in final]),
        "rows": rows,
    }


def analyse(rounds: Sequence[AuditRound], age_bands: Sequence[float] = DEFAULT_AGE_BANDS) -> dict:
    """All audit analyses of a session's (or episode's) audit rounds, as one dict."""
    rounds = list(rounds)
    return {
        "n_rounds": len(rounds),
        "layers": sorted({r.layer for r in rounds}),
        "prompt_survival": prompt_survival(rounds),
        "survival_by_age": survival_by_age(rounds, age_bands),
        "coverage": cross_head_coverage(rounds),
    }
