"""Hand-built LayerViews for policy unit tests."""

from __future__ import annotations

import pytest
import torch

from kvagent.runtime.policies.base import LayerView


def build_view(
    keys: torch.Tensor,
    queries: torch.Tensor,
    *,
    positions: torch.Tensor | None = None,
    query_positions: torch.Tensor | None = None,
    budget: int = 8,
    seed: int = 0,
    scaling: float | None = None,
    protected: torch.Tensor | None = None,
    block_ids: torch.Tensor | None = None,
    pending_queries: torch.Tensor | None = None,
    pending_positions: torch.Tensor | None = None,
    state: dict | None = None,
    layer_idx: int = 0,
    n_layers: int = 1,
) -> LayerView:
    """keys (B, H_kv, N, D), queries (B, H_q, W, D). Positions default to 0..N-1 in every head
    and the window queries to the last W positions (the window's tokens are in the cache)."""
    b, hkv, n, d = keys.shape
    hq, w = queries.shape[1], queries.shape[2]
    if positions is None:
        positions = torch.arange(n).expand(b, hkv, n).clone()
    if query_positions is None:
        query_positions = positions[0, 0, n - w :].clone() if w else torch.zeros(0, dtype=torch.long)
    return LayerView(
        keys=keys,
        values=torch.zeros_like(keys),
        positions=positions,
        queries=queries,
        query_positions=query_positions,
        layer_idx=layer_idx,
        n_layers=n_layers,
        group_size=hq // hkv,
        scaling=d**-0.5 if scaling is None else scaling,
        generator=torch.Generator().manual_seed(seed),
        budget=budget,
        protected=torch.zeros((b, hkv, n), dtype=torch.bool) if protected is None else protected,
        block_ids=block_ids,
        pending_queries=pending_queries,
        pending_positions=pending_positions,
        state={} if state is None else state,
    )


def random_view(b=1, hkv=2, group=2, n=40, w=4, d=8, seed=0, **kw) -> LayerView:
    g = torch.Generator().manual_seed(1000 + seed)
    keys = torch.randn((b, hkv, n, d), generator=g)
    queries = torch.randn((b, hkv * group, w, d), generator=g)
    return build_view(keys, queries, seed=seed, **kw)


def keep_set(scores: torch.Tensor, k: int) -> list[set[int]]:
    """What the runtime keeps for a token policy: top-k per head (batch 0), as sets of indices."""
    idx = scores[0].topk(k, dim=-1).indices
    return [set(row.tolist()) for row in idx]


@pytest.fixture
def make_view():
    return build_view


@pytest.fixture
def rand_view():
    return random_view


@pytest.fixture
def top_k():
    return keep_set


@pytest.fixture(scope="session")
def tiny_qwen3_engine(qwen3_tokenizer):
    """Tiny random GQA Qwen3 (2 layers, 4 query / 2 kv heads, vocab 512) on CPU, for oracle tests."""
    from kvagent.runtime import Engine
    from kvagent.runtime.models import tiny_random_model

    return Engine.load(
        tiny_random_model("qwen3", vocab_size=512, seed=1), tokenizer=qwen3_tokenizer, device="cpu"
    )
