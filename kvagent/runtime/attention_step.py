"""The static decode step's attention: one query token per row against its slot's whole slab (the
step has no length in its shapes), under the mask `positions >= 0`.

Two backends, chosen once per engine and recorded (`Decoder.attention`):
- `split` (split-KV, flash-decoding's idea in plain ops): the slab's width is cut into equal chunks
  of keys, so the two matmuls run one small problem per (row, KV head, chunk) and a lone session
  still spreads over the GPU's SMs; one softmax over the whole row normalises across chunks, and
  the chunks' partial outputs are summed. Scores are kept in float32 (`bmm(out_dtype=float32)` on
  CUDA in bf16/fp16), as fused attention kernels keep them. The default on CUDA.
- `sdpa`: one masked `scaled_dot_product_attention` over the slab, its kernel pinned (efficient
  attention on CUDA, the only fused one that takes an arbitrary mask; the CPU's own kernel there):
  on a GPU its grid is B x H_kv thread blocks with no split over the keys, so at N = 1 it leaves most
  SMs idle. The default on a CPU, where it measured faster (docs/benchmarks.md).

Slabs are `slab_width(C)` wide: the capacity, the static step's scratch column, then padding up to
a multiple of a small unit (so equal chunks exist), every column past the live entries at position -1 (masked), so the
chunks are views and equal. GQA without copies: a row's G = H_q / H_kv queries of a KV head are
the M dimension of its matmuls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BACKENDS = ("auto", "split", "sdpa")
KV_CHUNK = 256  # keys per split at most: 38 chunks of 224 at Qwen3-32B's K + 2r = 8448 (width 8512)
CUDA_UNIT = 64  # a CUDA slab's width is a multiple of this (0.8% padding at K + 2r = 8448)
CPU_UNIT = 8  # on a CPU (little padding; the split is not the default there)


def resolve(backend: str, device: torch.device) -> str:
    if backend not in BACKENDS:
        from kvagent.errors import ConfigError

        raise ConfigError(f"static attention: got {backend!r}; choose {', '.join(BACKENDS)}")
    if backend == "auto":
        return "split" if device.type == "cuda" else "sdpa"
    return backend


def slab_unit(device: torch.device) -> int:
    return CUDA_UNIT if device.type == "cuda" else CPU_UNIT


def slab_width(capacity: int, device: torch.device) -> int:
    """Columns of a slot's slab for `capacity` entries: room for the scratch column, rounded up."""
    unit = slab_unit(device)
    return -(-(capacity + 1) // unit) * unit


def n_splits(width: int, chunk: int) -> int:
    """Equal chunks of at most `chunk` keys that `width` divides into (1 when only tiny ones do)."""
    for size in range(min(chunk, width), 0, -1):
        if width % size == 0:
            return width // size if size * 4 >= min(chunk, width) else 1
    return 1


def wide_scores_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether bmm can write float32 from bf16/fp16 inputs here (CUDA builds since torch 2.8)."""
    if dtype == torch.float32 or device.type != "cuda":
        return False
    try:
        a = torch.zeros((1, 2, 2), dtype=dtype, device=device)
        return torch.bmm(a, a, out_dtype=torch.float32).dtype == torch.float32
    except (RuntimeError, TypeError):
        return False


def _bmm(a: torch.Tensor, b: torch.Tensor, wide: bool) -> torch.Tensor:
    """Batched matmul over every leading dim, the result in float32."""
    lead = a.shape[:-2]
    a3, b3 = a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:])
    out = torch.bmm(a3, b3, out_dtype=torch.float32) if wide else torch.bmm(a3, b3).float()
    return out.view(*lead, *out.shape[-2:])


def masked_softmax(scores: torch.Tensor, valid: torch.Tensor, scale: float) -> torch.Tensor:
    """Softmax over the last two dims (chunk, key) of float32 scores (B, H_kv, n, G, c) where valid
    (B, H_kv, n, 1, c); a row with no valid key (an empty batch row) gives zeros, not NaN."""
    s = torch.where(valid, scores * scale, float("-inf"))
    m = s.amax(dim=(2, 4), keepdim=True).clamp_min(torch.finfo(torch.float32).min)
    e = torch.exp(s - m)
    return e / e.sum(dim=(2, 4), keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)


def merge(parts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The chunks' partial outputs (B, H_kv, n, G, D) summed: (B, H_kv, G, D) in the model's dtype."""
    return parts.sum(dim=2).to(dtype)


def split_kv(q, keys, values, valid, scale: float, chunk: int, wide: bool, parts=None) -> torch.Tensor:
    """q (B, H_kv, G, D); keys, values (B, H_kv, W, D) whole slabs; valid (B, H_kv, 1, W).
    `parts`: (masked_softmax, merge), compiled by `Decoder.compile_parts` in a CUDA graph."""
    softmax, merged = parts or (masked_softmax, merge)
    b, h, g, d = q.shape
    width = keys.shape[2]
    n = n_splits(width, chunk)
    c = width // n
    k = keys.view(b, h, n, c, d)
    v = values.view(b, h, n, c, d)
    scores = _bmm(q.unsqueeze(2).expand(b, h, n, g, d), k.transpose(-1, -2), wide)  # (B, H, n, G, c)
    p = softmax(scores, valid.view(b, h, 1, n, c).transpose(2, 3), scale).to(values.dtype)
    return merged(_bmm(p, v, wide), values.dtype)


def masked_sdpa(q, keys, values, valid, scale: float) -> torch.Tensor:
    """One masked SDPA over the whole slabs, its CUDA kernel pinned (cuDNN and flash are never
    picked: flash takes no mask, and cuDNN's capture and cost at this shape are unmeasured)."""
    if q.device.type != "cuda":
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=valid, scale=scale)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=valid, scale=scale)
