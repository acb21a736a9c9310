"""Window attention, SnapKV and PyramidKV against explicit loop computations."""

import math

import pytest
import torch

from kvagent.errors import ConfigError
from kvagent.runtime.policies import make_policy
from kvagent.runtime.policies._attn import group_sum_attention, window_attention


def _gappy_positions(b, hkv, n, seed=0):
    # Different, non-contiguous positions per head, ascending: what a per-head policy leaves behind.
    g = torch.Generator().manual_seed(seed)
    out = torch.empty((b, hkv, n), dtype=torch.long)
    for bi in range(b):
        for h in range(hkv):
            out[bi, h] = torch.randperm(3 * n, generator=g)[:n].sort().values
    return out


def _explicit_probs(view):
    b, hq, w, _ = view.queries.shape
    n = view.keys.shape[2]
    out = torch.zeros((b, hq, w, n))
    for bi in range(b):
        for h in range(hq):
            kv = h // view.group_size
            for t in range(w):
                p = int(view.query_positions[t])
                vis = [j for j in range(n) if int(view.positions[bi, kv, j]) <= p]
                logits = torch.tensor([float(view.queries[bi, h, t] @ view.keys[bi, kv, j]) for j in vis])
                probs = torch.softmax(logits * view.scaling, dim=0)
                for j, pj in zip(vis, probs, strict=True):
                    out[bi, h, t, j] = pj
    return out


def _view(rand_view, seed=0, n=24, w=5):
    pos = _gappy_positions(2, 2, n, seed)
    view = rand_view(b=2, hkv=2, group=3, n=n, w=w, seed=seed, positions=pos)
    # Window queries sit inside the heads' position ranges, so the causal mask actually bites.
    view.query_positions = torch.tensor([40, 45, 50, 60, 71][:w])
    return view


def test_window_attention_matches_loop(rand_view):
    view = _view(rand_view)
    got = window_attention(
        view.queries, view.query_positions, view.keys, view.positions, view.group_size, view.scaling
    )
    want = _explicit_probs(view)
    assert torch.allclose(got, want, atol=1e-6)
    # Causal by logical position: no mass on keys from the future of the query.
    future = view.positions[:, :, None, None, :] > view.query_positions[None, None, None, :, None]
    future = future.expand(2, 2, 3, 5, 24).reshape(2, 6, 5, 24)
    assert got[future].abs().max() == 0
    assert torch.allclose(got.sum(-1), torch.ones(2, 6, 5))


def test_group_sum_attention_chunked_matches_loop(rand_view, monkeypatch):
    import kvagent.runtime.policies._attn as attn

    view = _view(rand_view)
    want = _explicit_probs(view).reshape(2, 2, 3, 5, 24).sum(dim=(2, 3))
    monkeypatch.setattr(attn, "_MAX_ELEMS", 2 * 6 * 24 * 2)  # forces chunks of 2 queries
    got = group_sum_attention(
        view.queries, view.query_positions, view.keys, view.positions, view.group_size, view.scaling
    )
    assert torch.allclose(got, want, atol=1e-5)


def _explicit_snapkv(view, kernel=7):
    probs = _explicit_probs(view)
    b, hq, w, n = probs.shape
    hkv, g = hq // view.group_size, view.group_size
    raw = torch.zeros((b, hkv, n))
    for bi in range(b):
        for kv in range(hkv):
            for j in range(n):
                raw[bi, kv, j] = sum(probs[bi, kv * g + i, t, j] for i in range(g) for t in range(w)) / (
                    g * w
                )
    pooled = torch.zeros_like(raw)
    r = kernel // 2
    for j in range(n):
        pooled[..., j] = raw[..., max(0, j - r) : j + r + 1].max(dim=-1).values
    return pooled


@pytest.mark.parametrize("name", ["snapkv", "pyramidkv"])
def test_snapkv_matches_loop(rand_view, name):
    view = _view(rand_view, seed=3)
    got = make_policy(name, keep_window=False).scores(view)
    assert got.shape == (2, 2, 24)
    assert torch.allclose(got, _explicit_snapkv(view), atol=1e-6)
    got3 = make_policy(name, keep_window=False, kernel=3).scores(view)
    assert torch.allclose(got3, _explicit_snapkv(view, 3), atol=1e-6)


def test_snapkv_keeps_window(rand_view):
    view = _view(rand_view, seed=4)
    plain = make_policy("snapkv", keep_window=False).scores(view)
    got = make_policy("snapkv").scores(view)
    win = view.positions >= 40
    assert win.any() and (~win).any()
    assert torch.equal(got[~win], plain[~win])
    # Window entries rank above every other entry of their head (but stay finite, below protection),
    # in their own attention order.
    for b in range(2):
        for h in range(2):
            w_, o_ = got[b, h][win[b, h]], got[b, h][~win[b, h]]
            assert torch.isfinite(w_).all() and w_.min() > o_.max()
            assert torch.equal(w_.argsort(), plain[b, h][win[b, h]].argsort())


def test_snapkv_bad_args():
    with pytest.raises(ConfigError, match="policy_args.kernel"):
        make_policy("snapkv", kernel=4)
    with pytest.raises(ConfigError, match="policy_args.keep_window"):
        make_policy("snapkv", keep_window="yes")


@pytest.mark.parametrize("budget", [16, 100, 1000, 4097])
@pytest.mark.parametrize("n_layers", [1, 2, 7, 28, 36])
@pytest.mark.parametrize("beta", [1, 2, 20])
def test_pyramid_budgets(budget, n_layers, beta):
    pol = make_policy("pyramidkv", beta=beta, min_budget=16)
    ks = pol.layer_budgets(budget, n_layers)
    assert len(ks) == n_layers
    assert sum(ks) == budget * n_layers
    assert all(a >= b for a, b in zip(ks, ks[1:], strict=False))
    assert min(ks) >= min(16, budget)
    if beta > 1 and n_layers > 1 and budget > 16:
        assert ks[0] > ks[-1]
        assert ks[-1] == max(16, budget // beta)
    if beta == 1:
        assert ks == [budget] * n_layers


def test_pyramid_budgets_linear():
    ks = make_policy("pyramidkv", beta=10, min_budget=1).layer_budgets(1000, 11)
    # Exactly the arithmetic sequence 1900 .. 100 in steps of 180.
    assert ks == [1900 - 180 * i for i in range(11)]
    assert math.isclose(sum(ks) / 11, 1000)


def test_pyramid_bad_args():
    with pytest.raises(ConfigError, match="policy_args.beta"):
        make_policy("pyramidkv", beta=0.5)
    with pytest.raises(ConfigError, match="policy_args.min_budget"):
        make_policy("pyramidkv", min_budget=0)
