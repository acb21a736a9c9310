"""The ~100M-parameter Qwen3-shaped random model the runtime benchmarks use (no download)."""

from __future__ import annotations

import torch

from kvagent.runtime.models import tiny_random_model

# 12 layers, hidden 768, 12 query / 4 KV heads of 64, MLP 2048, vocab 32k: ~101M parameters.
QWEN3_100M = dict(
    vocab_size=32_000,
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=4,
    head_dim=64,
)
QWEN3_QUICK = dict(
    vocab_size=8_000,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
)


def build(quick: bool = False):
    model = tiny_random_model("qwen3", **(QWEN3_QUICK if quick else QWEN3_100M))
    with torch.no_grad():  # realistic activation scale (the tiny model's wide init overflows at 12 layers)
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
    return model


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def tokenizer():
    from kvagent.runtime.models import load_qwen3_tokenizer

    return load_qwen3_tokenizer()
