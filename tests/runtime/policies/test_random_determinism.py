"""Random Attention's keep-sets, and seed determinism of every policy."""

import math

import pytest
import torch

from kvagent.runtime.policies import available, make_policy

N, K, H = 20, 5, 4


def test_random_per_head_uniform_and_independent(rand_view, top_k):
    rounds = 2000
    counts = torch.zeros(H, N)
    overlaps = []
    for seed in range(rounds):
        view = rand_view(hkv=H, group=1, n=N, seed=seed)
        sets = top_k(make_policy("random").scores(view), K)
        for h, s in enumerate(sets):
            counts[h, list(s)] += 1
        overlaps.append(len(sets[0] & sets[1]))
    expected = rounds * K / N
    chi2 = ((counts - expected) ** 2 / expected).sum(dim=1)
    # df = N - 1 = 19: the 0.999 quantile is 43.8. Fixed seeds make this deterministic.
    assert (chi2 < 43.8).all(), chi2
    # Independent heads: E|S0 & S1| = K * K / N = 1.25 (identical heads would give 5).
    assert abs(sum(overlaps) / rounds - K * K / N) < 0.1
    assert sum(o < K for o in overlaps) > 0.99 * rounds  # keep-sets differ across heads


def test_random_shared_same_in_every_head(rand_view, top_k):
    for seed in range(10):
        s = make_policy("random", shared=True).scores(rand_view(hkv=H, group=1, n=N, seed=seed))
        assert s.shape == (1, 1, N)
        assert len({frozenset(x) for x in top_k(s.expand(1, H, N), K)}) == 1


def _view_for(name, rand_view, seed):
    n = 48
    kw = {}
    if name == "nexus":
        ids = torch.full((n,), -1)
        ids[4:44] = torch.arange(40) // 4
        kw["block_ids"] = ids
    if name == "h2o":
        kw["pending_queries"] = torch.randn(1, 4, 6, 8, generator=torch.Generator().manual_seed(9))
        kw["pending_positions"] = torch.arange(n - 6, n)
    return rand_view(n=n, w=4, seed=seed, budget=16, **kw)


def _args(name):
    return {"nexus": {"block": 4}}.get(name, {})


def _keep(name, scores):
    # nexus: 16 entries are forced (8 outside blocks, sink and recent blocks), so keep 3 more blocks.
    k = 28 if name == "nexus" else 16
    return [frozenset(s) for s in scores[0].topk(k, dim=-1).indices.tolist()]


@pytest.mark.parametrize("name", ["full", "streaming", "random", "snapkv", "h2o", "pyramidkv", "nexus"])
def test_same_seed_same_keep_sets(name, rand_view):
    assert name in available()
    a = make_policy(name, **_args(name)).scores(_view_for(name, rand_view, 0))
    b = make_policy(name, **_args(name)).scores(_view_for(name, rand_view, 0))
    assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["random", "nexus"])
def test_different_seed_different_random_keep_sets(name, rand_view):
    # Same cache contents, only the generator seed changes.
    base = _view_for(name, rand_view, 0)
    keeps = set()
    for seed in range(5):
        base.generator = torch.Generator().manual_seed(seed)
        keeps.add(tuple(_keep(name, make_policy(name, **_args(name)).scores(base))))
    assert len(keeps) > 1


def test_nexus_deterministic_variant_ignores_seed(rand_view):
    base = _view_for("nexus", rand_view, 0)
    outs = []
    for seed in range(3):
        base.generator = torch.Generator().manual_seed(seed)
        outs.append(make_policy("nexus", block=4, n=math.inf).scores(base))
    assert all(torch.equal(outs[0], o) for o in outs)
