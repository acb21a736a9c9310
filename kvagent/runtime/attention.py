"""The one attention function kvagent registers with transformers, and the one place that picks
an attention kernel.

The function records post-RoPE queries for the eviction policies and hands attention to the
running forward (forward.py), which calls `attend_layer` per session (or `attend_rows` for a run of
decode tokens in consecutive pool slots): flash-attn on CUDA when importable, else torch SDPA.
Cached entries are always older than the current chunk, so a chunk needs bottom-right causal
masking whatever was evicted; a single decode token needs none. The paired mask function returns
no mask, so transformers never builds one aligned to the wrong corner.
"""

from __future__ import annotations

import contextvars
import importlib.util

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

ATTN_NAME = "kvagent"

# The forward currently running (per thread: the engine's batcher thread, or a solo session's
# caller), so attention can record each session's queries and attend each session's cache.
ACTIVE_CACHE: contextvars.ContextVar = contextvars.ContextVar("kvagent_active_cache", default=None)

_FLASH = None
_NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def decode_backends(device_type: str) -> list | None:
    """The SDPA kernels a decode call may use on `device_type` (None: PyTorch's own choice).

    On CUDA, PyTorch prefers cuDNN's attention on Hopper, and cuDNN builds an execution graph for
    every new key length: a decode step has a new length at every token (and, under per-layer
    budgets such as PyramidKV's, in every layer). Profiled on an H200 (docs/benchmarks.md, "GPU"):
    about 44 ms of host time per build, a third of a 64-layer decode step under a uniform budget
    (one build a step, shared by the layers) and nearly all of it under PyramidKV's. Flash and
    memory-efficient kernels have no per-shape set-up, so decode calls are kept to them (math stays
    as the last resort). Chunks need no such list: `sdpa` gives them a lower-right causal bias,
    which PyTorch sends to flash (or memory-efficient) attention, never to cuDNN."""
    return _NO_CUDNN if device_type == "cuda" else None


def _cpu_has_bf16_units() -> bool:
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


# Where a CPU has no bf16 units (AVX2 only), SDPA's GQA kernel for one decode query is 5-7x slower
# in bfloat16 than the same attention with a KV head's query group as its query rows (measured on
# the 2-core AMD EPYC VM, docs/benchmarks.md "Cuts"); with AMX, one row per head with GQA was the
# faster call in bfloat16 (commit 814f4e6's machine). float32 keeps its layouts everywhere.
CPU_BF16_UNITS = _cpu_has_bf16_units()


def fold_query_groups(query: torch.Tensor, masked: bool = False, decode: bool = True) -> bool:
    """Whether a call puts each KV head's query group in its query rows (no GQA expansion).

    On CUDA a masked call folds, decode or chunk: flash takes GQA but no mask, memory-efficient
    attention a mask but no GQA, and cuDNN is kept off decode (`decode_backends`), so a masked GQA
    call would fall to the math kernel, which copies K and V out to every query head. On the H200
    that made the batched step 2-4x the solo one at N=8 and ran out of memory at N=32
    (docs/benchmarks.md). On a CPU only a decode call in a reduced dtype without bf16 units folds."""
    if query.device.type == "cuda":
        return masked
    if query.dtype == torch.float32 or not decode:
        return False
    return query.device.type == "cpu" and not CPU_BF16_UNITS


def chunk_mask(q_len: int, kv_len: int, device: torch.device):
    """The mask of a chunk of `q_len` queries whose keys end the `kv_len` in the call: lower-right
    causal. A bool mask here sent bf16 GQA chunks to cuDNN on the H200, which builds a graph per new
    key length (per layer under PyramidKV's budgets); PyTorch sends this causal bias to flash (or
    memory-efficient) attention, which need no set-up, and materialises it where neither applies."""
    return causal_lower_right(q_len, kv_len)


def sdpa_call(query, key, value, decode: bool, **kw) -> torch.Tensor:
    """Every SDPA call of the runtime goes through here, so decode calls get `decode_backends`."""
    backends = decode_backends(query.device.type) if decode else None
    if backends is None:
        return F.scaled_dot_product_attention(query, key, value, **kw)
    with sdpa_kernel(backends):
        return F.scaled_dot_product_attention(query, key, value, **kw)


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


def sdpa(query, key, value, scaling, valid=None):
    """(B, q, H_q, D) attention of a chunk on a cache whose entries all precede it (bottom-right
    causal). `valid` (B, H_kv, kv_len) bool hides a ragged layer's PAD entries (cache.py), per head."""
    q_len, kv_len = query.shape[2], key.shape[2]
    gqa = query.shape[1] != key.shape[1]
    if gqa and fold_query_groups(query, masked=valid is not None, decode=q_len == 1):
        return _folded(query, key, value, scaling, valid)
    mask = None
    causal = False
    if valid is not None:
        mask = valid.repeat_interleave(query.shape[1] // key.shape[1], dim=1).unsqueeze(2)
        if q_len > 1:
            mask = mask & torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(
                kv_len - q_len
            )
    elif q_len > 1 and q_len == kv_len:
        causal = True
    elif q_len > 1:
        mask = chunk_mask(q_len, kv_len, query.device)
    out = sdpa_call(
        query, key, value, q_len == 1, attn_mask=mask, is_causal=causal, scale=scaling, enable_gqa=gqa
    )
    return out.transpose(1, 2)


def _folded(query, key, value, scaling, valid):
    """`sdpa` with (B, H_q, q, D) as (B, H_kv, group * q, D): query head h*group + j reads KV head
    h, as GQA's expansion maps them; PAD entries are masked per KV head, and a chunk's bottom-right
    causal mask is repeated for each of the group's query heads."""
    b, h_q, q_len, d = query.shape
    h_kv, kv_len = key.shape[1], key.shape[2]
    group = h_q // h_kv
    mask = None if valid is None else valid.unsqueeze(2)  # (B, H_kv, 1, kv_len)
    if q_len > 1:
        causal = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
        causal = causal.repeat(group, 1)  # row j*q + i is query i of the group's head j
        mask = causal if mask is None else mask & causal
    q = query.reshape(b, h_kv, group * q_len, d)
    out = sdpa_call(q, key, value, q_len == 1, attn_mask=mask, scale=scaling)
    return out.reshape(b, h_q, q_len, d).transpose(1, 2)


def flash(query, key, value, scaling):
    """As `sdpa` (no PAD entries), with flash-attn on CUDA."""
    from flash_attn import flash_attn_func

    # flash-attn aligns its causal mask bottom-right, which is what a chunk on a cache needs.
    return flash_attn_func(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        softmax_scale=scaling,
        causal=query.shape[2] > 1,
    )


def attend_layer(layer, query, scaling: float, backend: str, keys=None, values=None) -> torch.Tensor:
    """(1, q, H_q, D): one session's chunk of queries (1, H_q, q, D) against its cache layer, which
    already holds the chunk's own keys (`keys`/`values`: its live entries, if at hand). The kernel
    is chosen here and in `attend_rows` only."""
    heads = getattr(layer, "head_entries", None)
    if heads is not None:  # adaptive heads: a buffer per KV head (heads.py)
        g = query.shape[1] // layer.n_heads
        outs = []
        for h, (kh, vh) in enumerate(heads()):
            qh = query[:, h * g : (h + 1) * g]
            use_flash = backend == "flash" and qh.is_cuda
            outs.append(flash(qh, kh, vh, scaling) if use_flash else sdpa(qh, kh, vh, scaling))
        return torch.cat(outs, dim=2)
    if keys is None:
        keys, values = layer.live_kv()
    valid = layer.valid(keys.shape[2])
    if valid is None and backend == "flash" and query.is_cuda:
        return flash(query, keys, values, scaling)
    return sdpa(query, keys, values, scaling, valid)


def attend_rows(query, keys, values, lengths: list[int], scaling: float, backend: str) -> torch.Tensor:
    """(1, b, H_q, D): b decode tokens (query (b, H_q, D)), row i against the first lengths[i]
    entries of keys/values (b, H_kv, C, D) (views of consecutive pool slots, no copy)."""
    b, h_q = query.shape[0], query.shape[1]
    h_kv = keys.shape[1]
    if backend == "flash" and query.is_cuda and flash_available():
        from flash_attn import flash_attn_with_kvcache

        out = flash_attn_with_kvcache(
            query.unsqueeze(1),
            keys.transpose(1, 2),
            values.transpose(1, 2),
            cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device=query.device),
            softmax_scale=scaling,
            causal=False,
        )  # (b, 1, H_q, D)
        return out.transpose(0, 1)
    # One token per row; a per-row key-length mask hides each row's padding. In float32, in
    # bfloat16 on a CPU without bf16 units, and on CUDA under a mask (`fold_query_groups`), the
    # query heads sharing a KV head as that head's query rows (no GQA expansion) is the faster
    # call; elsewhere one query row per head with enable_gqa (1.5x faster in bfloat16 on commit
    # 814f4e6's CPU).
    n_max = max(lengths)
    mask = None
    if min(lengths) != n_max:
        n = torch.tensor(lengths, device=query.device)
        mask = (torch.arange(n_max, device=query.device) < n[:, None]).view(b, 1, 1, n_max)
    if query.dtype == torch.float32 or h_q == h_kv or fold_query_groups(query, masked=mask is not None):
        q, gqa = query.reshape(b, h_kv, h_q // h_kv, query.shape[-1]), False
    else:
        q, gqa = query.unsqueeze(2), True
    out = sdpa_call(
        q, keys[:, :, :n_max], values[:, :, :n_max], True, attn_mask=mask, scale=scaling, enable_gqa=gqa
    )
    return out.reshape(1, b, h_q, out.shape[-1])


def kvagent_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention-interface function: returns (B, q, H, D) output and no weights. Inside
    a kvagent forward (forward.py) the sessions' caches attend; outside one (the model run
    without a kvagent cache) it is plain causal attention."""
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError("kvagent attention does not support sliding-window layers")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    forward = ACTIVE_CACHE.get()
    if forward is None:
        return sdpa(query, key, value, scaling), None
    forward.record_queries(module.layer_idx, query)
    return forward.attend(module.layer_idx, query, key, value, scaling), None


def kvagent_mask(*args, **kwargs):
    """Mask-interface partner of `kvagent_attention`: the attention builds its own mask."""
    return None


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, kvagent_attention)
    AttentionMaskInterface.register(ATTN_NAME, kvagent_mask)
