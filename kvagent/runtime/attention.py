"""The one attention function kvagent registers with transformers.

It records post-RoPE queries for the eviction policies and computes attention over the (possibly
compacted) cache with flash-attn on CUDA when importable, else torch SDPA. Cached entries are
always older than the current chunk, so a chunk needs bottom-right causal masking whatever was
evicted; a single decode token needs none. The paired mask function returns no mask, so
transformers never builds one aligned to the wrong corner.
"""

from __future__ import annotations

import contextvars
import importlib.util

import torch
import torch.nn.functional as F

ATTN_NAME = "kvagent"

# The cache of the forward currently running (per thread/task), so attention can record queries.
ACTIVE_CACHE: contextvars.ContextVar = contextvars.ContextVar("kvagent_active_cache", default=None)

_FLASH = None


def flash_available() -> bool:
    global _FLASH
    if _FLASH is None:
        _FLASH = importlib.util.find_spec("flash_attn") is not None and torch.cuda.is_available()
    return _FLASH


def resolve_backend(attn: str, device: torch.device) -> str:
    """`auto` -> flash-attn on CUDA when installed, else sdpa."""
    from kvagent.errors import ConfigError

    if attn == "auto":
        return "flash" if device.type == "cuda" and flash_available() else "sdpa"
    if attn == "flash" and not (device.type == "cuda" and flash_available()):
        raise ConfigError(
            "attn: flash-attn needs CUDA and the flash-attn package; use attn='sdpa' or install .[gpu]"
        )
    if attn not in ("flash", "sdpa"):
        raise ConfigError(f"attn: got {attn!r}; choose auto, flash or sdpa")
    return attn


def _sdpa(query, key, value, scaling, valid=None):
    """`valid` (B, H_kv, kv_len) bool hides a ragged layer's PAD entries (cache.py), per head."""
    q_len, kv_len = query.shape[2], key.shape[2]
    mask = None
    causal = False
    if q_len > 1:
        if q_len == kv_len and valid is None:
            causal = True
        else:
            mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
    gqa = query.shape[1] != key.shape[1]
    if valid is not None:
        per_head = valid.repeat_interleave(query.shape[1] // key.shape[1], dim=1).unsqueeze(2)
        mask = per_head if mask is None else per_head & mask
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, is_causal=causal, scale=scaling, enable_gqa=gqa
    )
    return out.transpose(1, 2)


def _flash(query, key, value, scaling):
    from flash_attn import flash_attn_func

    # flash-attn aligns its causal mask bottom-right, which is what a chunk on a cache needs.
    return flash_attn_func(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        softmax_scale=scaling,
        causal=query.shape[2] > 1,
    )


def kvagent_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention-interface function: returns (B, q, H, D) output and no weights."""
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError("kvagent attention does not support sliding-window layers")
    cache = ACTIVE_CACHE.get()
    if cache is not None:
        cache.record_queries(module.layer_idx, query)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if getattr(cache, "packed", False):
        # Many sessions in one forward (batch.py): each attends its own cache.
        return cache.attend(module.layer_idx, query, scaling), None
    layer = cache.layers[module.layer_idx] if cache is not None else None
    if hasattr(layer, "attend"):  # head_budget=adaptive: a buffer per KV head (heads.py)
        return layer.attend(query, scaling, cache.backend), None
    valid = layer.valid(key.shape[2]) if hasattr(layer, "valid") else None
    if valid is None and cache is not None and cache.backend == "flash" and query.is_cuda:
        return _flash(query, key, value, scaling), None
    return _sdpa(query, key, value, scaling, valid), None


def kvagent_mask(*args, **kwargs):
    """Mask-interface partner of `kvagent_attention`: the attention builds its own mask."""
    return None


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, kvagent_attention)
    AttentionMaskInterface.register(ATTN_NAME, kvagent_mask)
