"""PyramidKV through the real runtime: on a tiny 6-layer model, the entries each layer keeps after
one compression are the paper's schedule (window kept in every layer, the rest split
arithmetically from the bottom layer to the top with beta), at K = 20% and 50% of the context."""

from __future__ import annotations

import pytest
import torch

from kvagent.runtime import CacheConfig, Engine
from kvagent.runtime.models import tiny_random_model

N_LAYERS, CONTEXT, WINDOW, BETA = 6, 240, 8, 4.0


@pytest.fixture(scope="module")
def six_layer_engine(qwen3_tokenizer):
    model = tiny_random_model("qwen3", vocab_size=512, seed=2, num_hidden_layers=N_LAYERS)
    return Engine.load(model, tokenizer=qwen3_tokenizer, device="cpu")


def paper_share(k: int, layer: int) -> float:
    """The paper's KV cache size for `layer`: the window, plus the arithmetic split of k - window
    from (2 - 1/beta)(k - window) at layer 0 down to (k - window) / beta at the top layer."""
    split = k - WINDOW
    top, bottom = split / BETA, 2 * split - split / BETA
    return WINDOW + bottom - (bottom - top) * layer / (N_LAYERS - 1)


@pytest.mark.parametrize("keep", [0.2, 0.5])
def test_layers_keep_the_papers_counts(six_layer_engine, keep):
    k = int(CONTEXT * keep)
    # Reprefill compresses the appended context once, to each layer's K.
    cfg = CacheConfig(policy="pyramidkv", budget=k, buffer=16, mode="reprefill", scope="prefill", protect="none",
                      window=WINDOW, policy_args={"beta": BETA, "window": WINDOW})  # fmt: skip
    s = six_layer_engine.session(cfg)
    ids = torch.randint(0, 512, (CONTEXT,), generator=torch.Generator().manual_seed(5)).tolist()
    s.append(ids)
    kept = s.kept_positions()
    # Each layer keeps its K_l plus the recent buffer (framework recent-buffer), outside the schedule.
    counts = [int(p.shape[-1]) - cfg.recent_buffer for p in kept]
    assert cfg.recent_buffer == cfg.buffer and s.stats.rounds == 1
    assert all(abs(c - paper_share(k, i)) < 1 for i, c in enumerate(counts)), counts
    assert sum(counts) == k * N_LAYERS
    assert counts == sorted(counts, reverse=True) and counts[0] > 2 * counts[-1]
    # Every layer, even the smallest, still holds its whole observation window.
    newest = set(range(s.logical_length - WINDOW, s.logical_length))
    for layer in kept:
        for head in layer[0]:
            assert newest <= set(head.tolist())
