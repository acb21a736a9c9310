"""R-KV: importance (group-max logits, window softmax, pooling) and redundancy, explicitly."""

import pytest
import torch

import kvagent.runtime.policies.rkv as rkv
from kvagent.errors import ConfigError
from kvagent.runtime.policies import make_policy


def _explicit_importance(view, kernel):
    b, hq, w, _ = view.queries.shape
    g, n = view.group_size, view.keys.shape[2]
    raw = torch.zeros((b, hq // g, n))
    for bi in range(b):
        for kv in range(hq // g):
            for t in range(w):
                p = int(view.query_positions[t])
                vis = [j for j in range(n) if int(view.positions[bi, kv, j]) <= p]
                logits = torch.tensor(
                    [
                        max(float(view.queries[bi, kv * g + i, t] @ view.keys[bi, kv, j]) for i in range(g))
                        for j in vis
                    ]
                )
                raw[bi, kv, vis] += torch.softmax(logits * view.scaling, dim=0) / w
    r = kernel // 2
    return torch.stack([raw[..., max(0, j - r) : j + r + 1].amax(-1) for j in range(n)], dim=-1)


def _explicit_redundancy(keys, threshold):
    b, h, n, _ = keys.shape
    out = torch.zeros((b, h, n))
    for bi in range(b):
        for hi in range(h):
            k = keys[bi, hi] / keys[bi, hi].norm(dim=-1, keepdim=True)
            sim = k @ k.T
            sim.fill_diagonal_(0.0)
            for i in range(n):
                similar = [j for j in range(n) if sim[i, j] > threshold]
                if similar:
                    sim[i, max(similar)] = 0.0
            out[bi, hi] = torch.softmax(sim.mean(dim=0), dim=0)
    return out


def _view(rand_view, seed=0):
    view = rand_view(b=2, hkv=2, group=3, n=26, w=4, seed=seed)
    view.query_positions = torch.tensor([18, 20, 23, 25])
    return view


@pytest.mark.parametrize("kernel", [1, 3, 7])
def test_importance_matches_loop(rand_view, kernel):
    view = _view(rand_view, seed=1)
    assert torch.allclose(rkv.importance(view, kernel), _explicit_importance(view, kernel), atol=1e-6)


def test_redundancy_matches_loop_chunked_or_not(rand_view, monkeypatch):
    view = _view(rand_view, seed=2)
    keys = view.keys.clone()
    keys[:, :, 10:14] = keys[:, :, 3:4] + 0.01 * torch.randn_like(keys[:, :, 10:14])  # near-duplicates
    want = _explicit_redundancy(keys, 0.5)
    assert torch.allclose(rkv.redundancy(keys, 0.5), want, atol=1e-6)
    monkeypatch.setattr(rkv, "_MAX_ELEMS", 2 * 2 * 26 * 3)  # rows in chunks of 3
    assert torch.allclose(rkv.redundancy(keys, 0.5), want, atol=1e-6)


def test_redundancy_lowers_duplicates_and_spares_the_newest_copy(make_view):
    # Orthogonal keys (rows of a permuted identity, some scaled): similarity is exactly 0 except
    # between the three copies of one key.
    g = torch.Generator().manual_seed(3)
    basis = torch.eye(32)[torch.randperm(32, generator=g)[:30]] * (1 + torch.rand((30, 1), generator=g))
    keys = basis.expand(1, 2, 30, 32).clone()
    dup = [4, 12, 21]
    keys[0, :, dup] = keys[0, :, 4:5] * torch.tensor([1.0, 2.0, 0.5]).reshape(3, 1)  # same direction
    view = make_view(keys, torch.randn((1, 4, 4, 32), generator=g))
    s = make_policy("rkv", lam=0.0, keep_window=False).scores(view)
    others = [j for j in range(30) if j not in dup]
    for h in range(2):
        # Each copy's row exempts its newest twin: 4 keeps both similarities, 12 one, 21 none.
        assert s[0, h, 4] < s[0, h, 12] < s[0, h, 21]
        assert torch.allclose(s[0, h, others], s[0, h, 21].expand(len(others)))


def test_score_blends_the_two_terms(rand_view):
    view = _view(rand_view, seed=4)
    imp, red = rkv.importance(view, 7), rkv.redundancy(view.keys, 0.5)
    s = make_policy("rkv", lam=0.3, keep_window=False).scores(view)
    assert torch.allclose(s, 0.3 * imp - 0.7 * red, atol=1e-7)
    assert torch.allclose(make_policy("rkv", lam=1.0, keep_window=False).scores(view), imp)


def test_keep_window_ranks_the_window_first(rand_view):
    view = _view(rand_view, seed=5)
    s = make_policy("rkv").scores(view)
    win = view.positions >= 18
    for b in range(2):
        for h in range(2):
            assert torch.isfinite(s[b, h]).all() and s[b, h][win[b, h]].min() > s[b, h][~win[b, h]].max()


@pytest.mark.parametrize(
    "args, field",
    [
        ({"lam": 1.5}, "lam"),
        ({"threshold": 2}, "threshold"),
        ({"kernel": 2}, "kernel"),
        ({"beta": 1}, "beta"),
    ],
)
def test_bad_args(args, field):
    with pytest.raises(ConfigError, match=field) as e:
        make_policy("rkv", **args)
    assert "\n" not in str(e.value)
