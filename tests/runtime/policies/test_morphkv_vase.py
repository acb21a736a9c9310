"""MorphKV (recent tokens' attention profiles, fused) and VaSE (largest value ranges kept, the rest
sampled in proportion to SnapKV's score) against their definitions."""

from __future__ import annotations

import pytest
import torch

from kvagent.errors import ConfigError
from kvagent.runtime.policies import make_policy
from kvagent.runtime.policies.snapkv import snapkv_scores


def _explicit_profiles(view):
    """Per KV head and window query: softmax over the entries older than the window (and not in
    the query's future) of the group's summed logits."""
    b, hq, w, _ = view.queries.shape
    hkv, n, g = view.keys.shape[1], view.keys.shape[2], view.group_size
    first = int(view.query_positions.min())
    out = torch.zeros((b, hkv, w, n))
    for bi in range(b):
        for kv in range(hkv):
            for t in range(w):
                p = int(view.query_positions[t])
                vis = [
                    j
                    for j in range(n)
                    if int(view.positions[bi, kv, j]) <= p and view.positions[bi, kv, j] < first
                ]
                if not vis:
                    continue
                logits = torch.tensor(
                    [
                        sum(float(view.queries[bi, kv * g + i, t] @ view.keys[bi, kv, j]) for i in range(g))
                        * view.scaling
                        for j in vis
                    ]
                )
                for j, pj in zip(vis, torch.softmax(logits, dim=0), strict=True):
                    out[bi, kv, t, j] = pj
    return out


@pytest.mark.parametrize("fusion", ["max", "sum"])
def test_morphkv_fuses_the_window_profiles(rand_view, fusion):
    view = rand_view(b=2, hkv=2, group=3, n=30, w=5, seed=4)
    got = make_policy("morphkv", fusion=fusion).scores(view)
    prof = _explicit_profiles(view)
    fused = prof.amax(dim=2) if fusion == "max" else prof.sum(dim=2)
    old = view.positions < int(view.query_positions.min())
    assert torch.allclose(got[old], fused[old], atol=1e-6)
    # The recent window ranks above every older entry of its head.
    for b in range(2):
        for h in range(2):
            assert got[b, h][~old[b, h]].min() > got[b, h][old[b, h]].max()


def test_morphkv_max_keeps_what_one_recent_token_needs(make_view):
    # Entry 3 is what the newest query looks at, alone; entry 7 gets a moderate share from every
    # window query. Max fusion keeps 3 (a token some recent step depends on); sum prefers 7.
    d, n, w = 8, 16, 4
    keys = torch.zeros((1, 1, n, d))
    keys[0, 0, 3, 0] = 1.0
    keys[0, 0, 7, 1] = 1.0
    q = torch.zeros((1, 1, w, d))
    q[0, 0, :, 1] = 2.0  # every window query: a moderate pull toward entry 7
    q[0, 0, -1, 0] = 9.0  # the newest one: a strong pull toward entry 3
    view = make_view(keys, q, scaling=1.0)
    best = {
        f: int(make_policy("morphkv", fusion=f).scores(view)[0, 0, : n - w].argmax()) for f in ("max", "sum")
    }
    assert best == {"max": 3, "sum": 7}


def test_morphkv_bad_fusion():
    with pytest.raises(ConfigError, match="^policy_args.fusion: must be one of max, sum"):
        make_policy("morphkv", fusion="mean")


def _vase_view(rand_view, seed=0, n=40, budget=16):
    view = rand_view(b=1, hkv=2, group=2, n=n, w=4, seed=seed, budget=budget)
    g = torch.Generator().manual_seed(99)
    view.values = torch.randn(view.keys.shape, generator=g)
    return view


def test_vase_always_keeps_the_largest_value_ranges(rand_view, top_k):
    for seed in range(20):
        view = _vase_view(rand_view, seed=seed)
        s = make_policy("vase").scores(view)
        rng = view.values.amax(-1) - view.values.amin(-1)
        n_large = 16 // 4
        for h, keep in enumerate(top_k(s, 16)):
            assert set(rng[0, h].topk(n_large).indices.tolist()) <= keep


def test_vase_fills_the_rest_in_proportion_to_the_snapkv_score(rand_view):
    # K = 4 keeps the one largest-range entry and samples exactly one more: over many rounds, how
    # often each entry is that one must follow its SnapKV score among the rest. The rounds are
    # the rows of one batch (the same cache repeated): each row draws its own uniforms.
    one = _vase_view(rand_view, n=12, budget=4)
    trials = 3000
    view = _vase_view(rand_view, n=12, budget=4)
    for name in ("keys", "values", "positions", "protected", "queries"):
        setattr(view, name, getattr(one, name).expand(trials, *getattr(one, name).shape[1:]).contiguous())
    pol = make_policy("vase", large=0.25)
    w = snapkv_scores(one, pol.kernel)[0, 0]
    rng = one.values[0, 0].amax(-1) - one.values[0, 0].amin(-1)
    big = int(rng.argmax())
    rest = [j for j in range(12) if j != big]
    order = pol.scores(view)[:, 0].argsort(dim=-1, descending=True)
    assert (order[:, 0] == big).all()
    counts = torch.bincount(order[:, 1], minlength=12).float()
    want = w[rest] / w[rest].sum()
    got = counts[rest] / trials
    assert (got - want).abs().max() < 0.03, (got, want)  # 3 sigma is ~0.016 at 3000 trials


def test_vase_draws_from_the_rounds_generator(rand_view, top_k):
    view = _vase_view(rand_view)

    def keep(seed):
        view.generator = torch.Generator().manual_seed(seed)
        return top_k(make_policy("vase").scores(view), 16)

    assert keep(1) == keep(1) and keep(1) != keep(2)


def test_vase_never_spends_its_large_picks_on_protected_entries(rand_view, top_k):
    view = _vase_view(rand_view)
    rng = view.values.amax(-1) - view.values.amin(-1)
    top = rng[0, 0].topk(4).indices
    view.protected[0, 0, top] = True  # the four largest ranges are protected anyway
    s = make_policy("vase").scores(view)
    nxt = rng[0, 0].masked_fill(view.protected[0, 0], float("-inf")).topk(4).indices
    assert (s[0, 0, nxt] > 1.0).all()


def test_vase_weights_are_stable_under_float_noise_and_floored_at_one_grid_step():
    # What a batched forward does to attention probabilities: the same weights, each off by a
    # last-bit-sized absolute error. Raw weights far below the head's largest change by a large
    # relative amount, so log(u)/w reorders; on the grid they are equal but at a grid line.
    from kvagent.runtime.policies.vase import grid_weights

    g = torch.Generator().manual_seed(0)
    w = torch.rand(1, 2, 400, generator=g) ** 8  # many tiny weights, as softmax tails are
    noisy = w + 1e-8 * torch.randn(w.shape, generator=g)
    cand = torch.ones(w.shape, dtype=torch.bool)
    a, b = grid_weights(w, cand), grid_weights(noisy.clamp_min(0), cand)
    assert (a != b).float().mean() < 0.01
    assert ((w / noisy.clamp_min(1e-30) - 1).abs() > 1e-3).any()  # the raw ones do move
    step = 2.0**-12
    assert a.min() == step and a.amax(-1).eq(1.0).all()
    assert torch.allclose(a, (w / w.amax(-1, keepdim=True)).clamp_min(step), atol=step / 2)
    # The largest CANDIDATE sets the scale: a kept (non-candidate) entry's weight does not.
    cand[..., 0] = False
    w2 = w.clone()
    w2[..., 0] = 100.0
    assert torch.equal(grid_weights(w2, cand)[..., 1:], grid_weights(w, cand)[..., 1:])
