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
@pytest.mark.parametrize("window", [0, 16, 64])
def test_pyramid_budgets(budget, n_layers, beta, window):
    ks = make_policy("pyramidkv", beta=beta, window=window).layer_budgets(budget, n_layers)
    assert len(ks) == n_layers
    assert sum(ks) == budget * n_layers
    assert all(a >= b for a, b in zip(ks, ks[1:], strict=False))
    k = budget - window  # what the pyramid splits, after every layer's window
    if k <= 0 or beta == 1:
        assert ks == [budget] * n_layers
        return
    # Each layer within one entry of the paper's exact share: top k / beta, bottom 2k - k / beta,
    # linear between, plus the window.
    for i, got in enumerate(ks):
        top, bottom = k / beta, 2 * k - k / beta
        exact = window + (bottom - (bottom - top) * i / max(1, n_layers - 1) if n_layers > 1 else k)
        assert abs(got - exact) < 1, (i, got, exact)
    assert min(ks) >= min(window, budget)


@pytest.mark.parametrize(
    "budget, n_layers, window, beta, want",
    [
        # k = 84: top 4.2, bottom 163.8, step 53.2 -> floors 163, 110, 57, 4 (334 of 336); the two
        # largest remainders (.8, .6) get one more; then + 16 each.
        (100, 4, 16, 20, [180, 127, 73, 20]),
        # k = 48: 72, 48, 24 exactly, + 16.
        (64, 3, 16, 2, [88, 64, 40]),
        # No window: 39, 29.5, 20, 10.5, 1 -> the tie between the two halves goes to the lower layer.
        (20, 5, 0, 20, [39, 30, 20, 10, 1]),
        # 1900 .. 100 in steps of 180: the arithmetic sequence itself.
        (1000, 11, 0, 10, [1900 - 180 * i for i in range(11)]),
        # The window takes the whole budget: nothing to split, uniform.
        (16, 4, 16, 20, [16, 16, 16, 16]),
    ],
)
def test_pyramid_budgets_exact(budget, n_layers, window, beta, want):
    got = make_policy("pyramidkv", beta=beta, window=window).layer_budgets(budget, n_layers)
    assert got == want and sum(got) == budget * n_layers


@pytest.mark.parametrize(
    "budget, n_layers, window, min_budget, want",
    [
        # k = 32, top share max(1.6, 32 - 16) = 16, bottom 48: + 16 each.
        (48, 2, 16, 32, [64, 32]),
        # No window, k = 100: top max(5, 20) = 20, bottom 180, step 80.
        (100, 3, 0, 20, [180, 100, 20]),
        # A floor above K: uniform.
        (48, 3, 16, 60, [48, 48, 48]),
    ],
)
def test_pyramid_min_budget_raises_the_top_of_the_line(budget, n_layers, window, min_budget, want):
    pol = make_policy("pyramidkv", window=window, min_budget=min_budget)
    got = pol.layer_budgets(budget, n_layers)
    assert got == want and sum(got) == budget * n_layers


def test_pyramid_budgets_on_the_reference_protocol():
    # SmolLM2 (30 layers), 20% of 2,048 tokens, window 64: every layer keeps its window plus
    # its share of 345; the top layer 64 + 345 / 20 = 81.25 -> 81, the bottom 64 + 672.75.
    ks = make_policy("pyramidkv", window=64).layer_budgets(409, 30)
    assert ks[-1] == 81 and ks[0] in (736, 737) and sum(ks) == 409 * 30
    assert math.isclose(sum(ks) / 30, 409)


def test_pyramid_warns_when_the_window_is_wider_than_its_reserve(rand_view):
    view = _view(rand_view, seed=2)  # 5 window queries
    with pytest.warns(UserWarning, match="window=5"):
        make_policy("pyramidkv", window=4).scores(view)


def test_pyramid_bad_args():
    with pytest.raises(ConfigError, match="policy_args.beta"):
        make_policy("pyramidkv", beta=0.5)
    with pytest.raises(ConfigError, match="policy_args.window"):
        make_policy("pyramidkv", window=-1)
    with pytest.raises(ConfigError, match="policy_args.min_budget"):
        make_policy("pyramidkv", min_budget=0)
