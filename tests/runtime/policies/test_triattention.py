"""TriAttention against transformers' own RoPE: un-rotation, and the trigonometric score as the
logit a centred future query would give each key."""

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import kvagent.runtime.policies.triattention as tri
from kvagent.errors import ConfigError
from kvagent.runtime.models import tiny_random_model
from kvagent.runtime.policies import make_policy
from kvagent.runtime.policies.triattention import offset_mean, rope_frequencies, trig_scores, unrotate

THETA, D = 10_000.0, 16


def _rope(x, positions):
    """HF's RoPE (Llama/Qwen apply_rotary_pos_emb) of x (B, H, T, D) at positions (T,)."""
    inv = rope_frequencies(THETA, x.shape[-1]).float()
    freqs = positions.float().unsqueeze(-1) * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos()[None], emb.sin()[None]
    out, _ = apply_rotary_pos_emb(x, x, cos, sin)
    return out


def test_frequencies_are_the_models():
    model = tiny_random_model("qwen3", vocab_size=64)
    assert model.config.rope_parameters["rope_theta"] == THETA
    assert torch.allclose(rope_frequencies(THETA, D).float(), model.model.rotary_emb.inv_freq)


def test_unrotate_inverts_rope():
    g = torch.Generator().manual_seed(0)
    x = torch.randn((1, 2, 9, D), generator=g)
    pos = torch.tensor([0, 3, 4, 10, 50, 51, 300, 1000, 4095])
    z = unrotate(_rope(x, pos), pos.expand(1, 2, 9), rope_frequencies(THETA, D))
    # float32 angles of ~4000 rad carry ~2e-4 of rounding (the model's own keys do too).
    assert torch.allclose(z.real.float(), x[..., : D // 2], atol=1e-3)
    assert torch.allclose(z.imag.float(), x[..., D // 2 :], atol=1e-3)
    assert not torch.allclose(z.real.float(), _rope(x, pos)[..., : D // 2], atol=1e-2)


def test_trig_score_is_the_future_querys_logit(make_view):
    # Every window query has the same pre-RoPE vector q: the centre is q, the spread term is 0,
    # and with offset_max=1 the score is exactly q's logit at the next position + 1.
    g = torch.Generator().manual_seed(1)
    n, w = 40, 4
    key_pos = torch.randperm(200, generator=g)[:n].sort().values
    keys_pre = torch.randn((1, 2, n, D), generator=g)
    keys = _rope(keys_pre, key_pos)
    q_pre = torch.randn((1, 4, 1, D), generator=g).expand(1, 4, w, D)
    qpos = key_pos[-w:]
    view = make_view(keys, _rope(q_pre.contiguous(), qpos), positions=key_pos.expand(1, 2, n).clone())
    view.query_positions = qpos
    s = trig_scores(view, rope_frequencies(THETA, D), offset_max=1)
    future = _rope(q_pre[:, :, :1].contiguous(), torch.tensor([int(key_pos[-1]) + 2]))  # now + 1
    want = (future.reshape(1, 2, 2, 1, D) * keys.unsqueeze(2)).sum(-1).reshape(1, 4, n)
    assert torch.allclose(s, want, atol=1e-4)


def test_offsets_average_the_logit_over_future_distances():
    inv = rope_frequencies(THETA, D)
    m = offset_mean(inv, 65536)
    d = torch.tensor([2.0**i for i in range(17)], dtype=torch.float64)
    assert torch.allclose(m, torch.exp(1j * d.unsqueeze(-1) * inv).mean(0))
    assert torch.allclose(offset_mean(inv, 100), offset_mean(inv, 64))  # 1 .. 64: seven distances


def test_scores_are_zscored_per_head_then_group_max(rand_view):
    view = rand_view(b=1, hkv=2, group=2, n=30, w=4, d=D, seed=2)
    view.protected[..., :5] = True
    raw = trig_scores(view, rope_frequencies(THETA, D), 65536).reshape(1, 2, 2, 30)
    c = raw[..., 5:]
    z = (raw - c.mean(-1, keepdim=True)) / c.std(-1, unbiased=False, keepdim=True)
    s = make_policy("triattention", rope_theta=THETA, recent=0).scores(view)
    assert torch.allclose(s, z.amax(dim=2), atol=1e-5)
    plain = make_policy("triattention", rope_theta=THETA, recent=0, normalize=False).scores(view)
    assert torch.allclose(plain, raw.amax(dim=2), atol=1e-5)


def test_recent_entries_rank_first(rand_view):
    view = rand_view(hkv=2, group=2, n=30, w=4, d=D, seed=3)
    s = make_policy("triattention", rope_theta=THETA, recent=6).scores(view)
    assert torch.isfinite(s).all()
    assert (s[..., -6:].amin(-1) > s[..., :-6].amax(-1)).all()


def test_without_rope_theta_it_falls_back_to_norms_and_warns(rand_view):
    view = rand_view(b=1, hkv=2, group=2, n=20, w=3, d=D, seed=4)
    pol = make_policy("triattention", recent=0, normalize=False)
    tri._warn_no_rope.cache_clear()
    with pytest.warns(UserWarning, match="rope_theta"):
        s = pol.scores(view)
    # sum_f E|q_f| |k_f|, by loops over the half-split pairs.
    want = torch.zeros((1, 2, 20))
    for kv in range(2):
        for j in range(20):
            k = view.keys[0, kv, j]
            kabs = (k[: D // 2] ** 2 + k[D // 2 :] ** 2).sqrt()
            heads = []
            for h in (2 * kv, 2 * kv + 1):
                q = view.queries[0, h]
                qabs = (q[:, : D // 2] ** 2 + q[:, D // 2 :] ** 2).sqrt().mean(0)
                heads.append(float(qabs @ kabs))
            want[0, kv, j] = max(heads)
    assert torch.allclose(s, want, rtol=5e-4)  # compared at 2^-12 relative precision
    # Rotation-free: rotating every key and query by its position changes nothing.
    pos = torch.arange(20)
    view.keys = _rope(view.keys, pos)
    view.queries = _rope(view.queries, pos[-3:])
    assert torch.allclose(pol.scores(view), want, rtol=5e-4)


def test_args_are_checked():
    for args, field in [
        ({"rope_theta": 0.5}, "rope_theta"),
        ({"offset_max": 0}, "offset_max"),
        ({"recent": -1}, "recent"),
        ({"normalize": 1}, "normalize"),
        ({"theta": 1}, "theta"),
    ]:
        with pytest.raises(ConfigError, match=field) as e:
            make_policy("triattention", **args)
        assert "\n" not in str(e.value)
