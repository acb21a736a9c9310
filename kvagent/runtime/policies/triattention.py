"""TriAttention: score keys by the attention a typical future query would give them, from the
pre-RoPE query centre and the key's distance (a trigonometric series over RoPE frequencies)."""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from kvagent.runtime.policies._args import (
    bool_knob,
    float_arg,
    int_arg,
    int_knob,
    knob,
    optional,
    recency_knob,
)
from kvagent.runtime.policies._keep import rank_newest_first
from kvagent.runtime.policies.base import BasePolicy, LayerView, own_recency, register
from kvagent.runtime.policies.knorm import round_relative


@functools.cache
def _warn_no_rope() -> None:
    warnings.warn(
        "triattention: no RoPE frequencies (none from the model, and policy_args sets no rope_theta), "
        "so scores use key and query norms only (no trigonometric term); set policy_args rope_theta "
        "for TriAttention proper",
        stacklevel=3,
    )


def rope_frequencies(theta: float, head_dim: int, device=None) -> torch.Tensor:
    """(D/2,) angular frequency of each RoPE pair, theta^(-2f/D) (unscaled RoPE)."""
    return theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)


def unrotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Pre-RoPE complex pairs (..., D/2) of post-RoPE vectors x (..., D) at `positions` (x.shape[:-1]).

    The HF convention (Llama, Qwen): pair f is (x_f, x_{f+D/2}), and RoPE multiplies the complex
    number x_f + i x_{f+D/2} by exp(i * pos * w_f); undoing it multiplies by exp(-i * pos * w_f).
    """
    half = x.shape[-1] // 2
    z = torch.complex(x[..., :half].float(), x[..., half:].float())
    return z * unit(-positions.to(x.device, torch.float64).unsqueeze(-1) * inv_freq.to(x.device))


def unit(angle: torch.Tensor) -> torch.Tensor:
    """exp(i * angle) in complex64. The angle is reduced mod 2 pi in float64 first: at positions
    of 1e5 a float32 angle would be off by ~1e-2 rad."""
    a = torch.remainder(angle.double(), 2 * math.pi).float()
    return torch.polar(torch.ones_like(a), a)


def offset_mean(inv_freq: torch.Tensor, offset_max: int) -> torch.Tensor:
    """(D/2,) mean over future distances d = 1, 2, 4, ..., <= offset_max of exp(i * w_f * d)."""
    d = 2.0 ** torch.arange(int(math.log2(offset_max)) + 1, dtype=torch.float64, device=inv_freq.device)
    angle = d.unsqueeze(-1) * inv_freq
    return torch.polar(torch.ones_like(angle), angle).mean(dim=0)


def trig_scores(view: LayerView, inv_freq: torch.Tensor, offset_max: int) -> torch.Tensor:
    """(B, H_q, N): per query head, the expected logit of a future query at the centre of the
    window's pre-RoPE queries, averaged over the geometric distances, plus the norm term.

    With c_f the mean pre-RoPE query pair, a_f the mean of |q_f|, k_f the key's pre-RoPE pair and
    D the distance from the current position: Re sum_f c_f conj(k_f) exp(i w_f D) E_d[exp(i w_f d)]
    + sum_f (a_f - |c_f|) |k_f|. The second term credits large keys for the part of the query
    that is not concentrated at the centre.
    """
    b, hkv, n, _ = view.keys.shape
    g = view.group_size
    zq = unrotate(view.queries, view.query_positions.expand(view.queries.shape[:-1]), inv_freq)
    c = zq.mean(dim=2)  # (B, H_q, F)
    spread = zq.abs().mean(dim=2) - c.abs()  # >= 0: the query norm not explained by the centre
    zk = unrotate(view.keys, view.positions, inv_freq)  # (B, H_kv, N, F)
    now = view.positions.amax() + 1  # the next token's position
    dist = (now - view.positions).to(torch.float64).unsqueeze(-1)  # (B, H_kv, N, 1)
    phase = unit(dist * inv_freq) * offset_mean(inv_freq, offset_max).to(torch.complex64)
    rot_k = (zk.conj() * phase).unsqueeze(2)  # (B, H_kv, 1, N, F)
    c = c.reshape(b, hkv, g, 1, -1)
    trig = (c * rot_k).real.sum(dim=-1)  # (B, H_kv, g, N)
    extra = (spread.reshape(b, hkv, g, 1, -1) * zk.abs().unsqueeze(2)).sum(dim=-1)
    return (trig + extra).reshape(b, hkv * g, n)


def norm_scores(view: LayerView) -> torch.Tensor:
    """(B, H_q, N): sum_f E|q_f| |k_f|, the paper's ablation without the trigonometric and centre
    terms. Pair magnitudes are unchanged by RoPE, so it needs no RoPE parameters."""
    b, hkv, n, d = view.keys.shape
    half, g = d // 2, view.group_size
    q, k = view.queries.float(), view.keys.float()
    qa = torch.complex(q[..., :half], q[..., half:]).abs().mean(dim=2)  # (B, H_q, F)
    ka = torch.complex(k[..., :half], k[..., half:]).abs()  # (B, H_kv, N, F)
    s = (qa.reshape(b, hkv, g, 1, half) * ka.unsqueeze(2)).sum(dim=-1)
    return round_relative(s.reshape(b, hkv * g, n))  # repeated tokens tie exactly in layer 0


def frequencies(name: str, value: Any) -> torch.Tensor | None:
    """RoPE angular frequencies as a flat float64 tensor (the model's, via Engine.model_facts)."""
    return None if value is None else torch.as_tensor(value, dtype=torch.float64).flatten()


@register
@dataclass
class TriAttentionPolicy(BasePolicy):
    """TriAttention (Mao, Lin, Huang, Xie, Fu, et al., 2026, "TriAttention: Efficient Long Reasoning
    with Trigonometric KV Compression", arXiv:2604.04921; code github.com/WeianMao/triattention).

    Pre-RoPE queries cluster around a fixed centre, so the logit a future query gives a key is a
    trigonometric series in their distance (`trig_scores`). Per query head the score is z-scored
    over the evictable entries (`normalize`, default on as in the authors' runner), then each KV
    head takes the max over its GQA group (their per-(layer, head) mode). The newest `recent`
    entries rank first; None (default) leaves it to the framework: 128 (their window) under
    topk-all, 0 under recent-buffer, whose recent buffer keeps the newest r entries instead. Distances: 1, 2, 4, ... <= `offset_max`
    (default 65536), averaged.

    Assumptions where the runtime differs from the paper: the query centre and mean norms come
    from this layer's window queries (the paper calibrates them offline on a text corpus); RoPE
    is HF's half-split pairing, and the extra magnitude scale of scaled RoPE variants (YaRN's
    attention factor) is 1. The frequencies are the model's own: a session fills `inv_freq` from
    the model's rotary embedding (`Engine.model_facts`, so scaled variants such as YaRN are right
    too); an explicit `rope_theta` overrides it with unscaled RoPE of that base. With neither (a
    policy made outside a session) it falls back to `norm_scores`, which needs none, and warns
    once: that is the paper's no-trig ablation, not TriAttention.
    """

    name = "triattention"
    model_args = ("inv_freq",)

    rope_theta: float | None = knob(None, optional(functools.partial(float_arg, lo=1.0)))
    offset_max: int = int_knob(65536, 1)
    normalize: bool = bool_knob(True)
    recent: int | None = recency_knob(int_arg, minimum=0)
    # From the model unless given; left out of the repr (D/2 numbers) and of ==.
    inv_freq: torch.Tensor | None = knob(None, frequencies, repr=False, compare=False)

    def scores(self, view: LayerView) -> torch.Tensor:
        b, hkv, n = view.positions.shape
        if view.queries.shape[2] == 0:
            return torch.zeros((b, hkv, n), dtype=torch.float32, device=view.keys.device)
        inv_freq = self._frequencies(view)
        if inv_freq is None:
            _warn_no_rope()
            s = norm_scores(view)
        else:
            s = trig_scores(view, inv_freq, self.offset_max)
        s = s.reshape(b, hkv, view.group_size, n)
        if self.normalize:
            # Over the evictable entries only, as the authors z-score decode tokens but not the
            # protected prefix; the heads of a group then compete on one scale.
            cand = view.candidates.unsqueeze(2).to(s.dtype)
            cnt = cand.sum(dim=-1, keepdim=True).clamp_min(1.0)
            mean = (s * cand).sum(dim=-1, keepdim=True) / cnt
            var = (((s - mean) * cand) ** 2).sum(dim=-1, keepdim=True) / cnt
            s = (s - mean) / var.sqrt().clamp_min(1e-6)
        s = s.amax(dim=2)
        return rank_newest_first(s, min(own_recency(self.recent, 128, 0, view), n))

    def _frequencies(self, view: LayerView) -> torch.Tensor | None:
        if self.rope_theta is not None:
            return rope_frequencies(self.rope_theta, view.keys.shape[-1], view.keys.device)
        if self.inv_freq is not None:
            if 2 * self.inv_freq.numel() != view.keys.shape[-1]:
                raise ValueError(
                    f"triattention: {self.inv_freq.numel()} RoPE frequencies for head_dim "
                    f"{view.keys.shape[-1]} (partial rotary is not supported); set rope_theta"
                )
            return self.inv_freq.to(view.keys.device)
        return None
