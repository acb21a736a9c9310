"""TOVA, KNorm and KeyDiff: each score against its defining property, computed explicitly."""

import pytest
import torch

from kvagent.errors import ConfigError
from kvagent.runtime.policies import make_policy


def _last_query_attention(view):
    """(B, H_q, N) softmax of each head's newest query over the keys it can see, by loops."""
    b, hq, _, _ = view.queries.shape
    n = view.keys.shape[2]
    p = int(view.query_positions[-1])
    out = torch.zeros((b, hq, n))
    for bi in range(b):
        for h in range(hq):
            kv = h // view.group_size
            vis = [j for j in range(n) if int(view.positions[bi, kv, j]) <= p]
            logits = torch.stack([view.queries[bi, h, -1] @ view.keys[bi, kv, j] for j in vis])
            out[bi, h, vis] = torch.softmax(logits * view.scaling, dim=0)
    return out


def test_tova_is_the_last_querys_attention(rand_view):
    view = rand_view(b=2, hkv=2, group=3, n=30, w=5, seed=1)
    view.query_positions = torch.tensor([20, 22, 24, 26, 27])  # the causal mask bites
    want = _last_query_attention(view)
    shared = make_policy("tova").scores(view)
    assert shared.shape == (2, 1, 30)
    assert torch.allclose(shared, want.mean(dim=1, keepdim=True), atol=1e-6)
    grouped = make_policy("tova", shared=False).scores(view)
    assert torch.allclose(grouped, want.reshape(2, 2, 3, 30).mean(dim=2), atol=1e-6)
    assert (grouped[..., 28:] == 0).all()  # after the last query: never attended


def test_tova_ignores_all_but_the_last_query(rand_view):
    view = rand_view(hkv=2, group=2, n=24, w=4, seed=2)
    a = make_policy("tova", shared=False).scores(view)
    view.queries[:, :, :-1] = torch.randn_like(view.queries[:, :, :-1]) * 10
    b = make_policy("tova", shared=False).scores(view)
    assert torch.equal(a, b)


def test_tova_keeps_what_the_last_query_looks_at(make_view, top_k):
    g = torch.Generator().manual_seed(3)
    keys = torch.randn((1, 2, 32, 8), generator=g) * 0.1
    q = torch.randn((1, 4, 4, 8), generator=g) * 0.1
    targets = [3, 11, 17]
    for j in targets:  # the newest query of every head points at these keys
        keys[0, :, j] = 3.0 * q[0, 0, -1] / q[0, 0, -1].norm()
    q[0, :, -1] = q[0, 0, -1] / q[0, 0, -1].norm() * 3.0
    s = make_policy("tova", shared=False).scores(make_view(keys, q))
    assert all(keep == set(targets) for keep in top_k(s, 3))


def test_knorm_keeps_the_smallest_norm_keys(make_view, top_k):
    g = torch.Generator().manual_seed(4)
    keys = torch.nn.functional.normalize(torch.randn((1, 2, 20, 8), generator=g), dim=-1)
    norms = torch.rand((1, 2, 20), generator=g) * 5 + 0.1
    view = make_view(keys * norms.unsqueeze(-1), torch.randn((1, 4, 3, 8), generator=g))
    s = make_policy("knorm").scores(view)
    assert torch.allclose(s, -norms, rtol=5e-4)
    for h, keep in enumerate(top_k(s, 6)):
        assert keep == set(norms[0, h].argsort()[:6].tolist())


def test_knorm_copies_of_a_key_tie_exactly_whatever_the_float_noise(make_view):
    # One token at several positions: equal norms up to rounding noise, which differs between a
    # batched and a solo forward. The scores must not depend on that noise.
    g = torch.Generator().manual_seed(7)
    keys = torch.randn((1, 1, 12, 8), generator=g)
    keys[0, 0, [2, 5, 9]] = keys[0, 0, 2].clone()
    noisy = keys.clone()
    noisy[0, 0, [5, 9]] *= torch.tensor([1 + 3e-7, 1 - 2e-7]).reshape(2, 1)
    q = torch.randn((1, 2, 2, 8), generator=g)
    a = make_policy("knorm").scores(make_view(keys, q))
    b = make_policy("knorm").scores(make_view(noisy, q))
    assert torch.equal(a, b) and a[0, 0, 2] == a[0, 0, 5] == a[0, 0, 9]


def test_keydiff_is_negative_cosine_to_the_mean_direction(rand_view):
    view = rand_view(b=2, hkv=2, group=2, n=16, seed=5)
    s = make_policy("keydiff").scores(view)
    for b in range(2):
        for h in range(2):
            k = view.keys[b, h]
            anchor = torch.stack([kj / kj.norm() for kj in k]).mean(dim=0)
            want = torch.stack([-(kj @ anchor) / (kj.norm() * anchor.norm()) for kj in k])
            assert torch.allclose(s[b, h], want, atol=1e-6)
    # Only directions count: rescaling a key leaves every score unchanged.
    view.keys[:, :, 3] *= 7.0
    assert torch.allclose(make_policy("keydiff").scores(view), s, atol=1e-6)


def test_keydiff_keeps_the_distinctive_keys(make_view, top_k):
    g = torch.Generator().manual_seed(6)
    common = torch.randn(8, generator=g)
    keys = common + 0.05 * torch.randn((1, 2, 24, 8), generator=g)
    odd = [2, 9, 20]
    keys[0, :, odd] = torch.randn((2, 3, 8), generator=g)
    s = make_policy("keydiff").scores(make_view(keys, torch.randn((1, 4, 2, 8), generator=g)))
    assert all(keep == set(odd) for keep in top_k(s, 3))


@pytest.mark.parametrize(
    "name, args, field",
    [("tova", {"shared": 1}, "shared"), ("knorm", {"k": 1}, "k"), ("keydiff", {"x": 1}, "x")],
)
def test_bad_args_are_one_line_config_errors(name, args, field):
    with pytest.raises(ConfigError, match=field) as e:
        make_policy(name, **args)
    assert "\n" not in str(e.value)
