"""Nexus Sampling: the walk, the log-space reservoir priority, its limits, forced blocks."""

import math

import pytest
import torch

from kvagent.errors import ConfigError
from kvagent.runtime.policies import make_policy
from kvagent.runtime.policies.nexus import block_rows, log_priority, nexus_weights

# Candidate blocks of the 2-cluster example: X (attended early in the window only), cluster 1 = A,
# bridge = B, cluster 2 = D. Rows are window rows (oldest first), already block-normalised.
X, A, B, D = 0, 1, 2, 3
ROWS = torch.tensor(
    [
        [1.0, 0.0, 0.0, 0.0],  # early rows look at X
        [1.0, 0.0, 0.0, 0.0],
        [0.0, 0.5, 0.5, 0.0],  # last 3 rows: A-B, B-D, A-B: B bridges the two clusters
        [0.0, 0.0, 0.5, 0.5],
        [0.0, 0.5, 0.5, 0.0],
    ]
)[None]


def test_walk_values_start_from_zero():
    a, c, w = nexus_weights(ROWS, walk_steps=3, lam=0.5, eps_tie=0.0)
    assert torch.allclose(a[0], torch.tensor([0.4, 0.2, 0.3, 0.1]))
    # C = r2; gamma = 1 + <r3, C> = 1.25; C += 1.25 r3; gamma = 1 + <r4, C> = 1.8125; C += 1.8125 r4.
    C = torch.tensor([0.0, 0.5 + 1.8125 * 0.5, 0.5 + 1.25 * 0.5 + 1.8125 * 0.5, 1.25 * 0.5])
    assert torch.allclose(c[0], C / C.sum())
    assert torch.allclose(w, a + 0.5 * c)


def test_walk_raises_bridge_above_direct_score():
    a, c, w = nexus_weights(ROWS, walk_steps=3, lam=0.5, eps_tie=0.0)
    assert a[0, X] > a[0, B]  # by direct attention X beats the bridge ...
    assert w[0, B] > w[0, X]  # ... the walk lifts the bridge above it
    assert c[0, B] > a[0, B]
    gain = w[0] - a[0]
    assert gain.argmax() == B
    # The walk's gamma weighting matters: it gives B more than a plain mean of the last 3 rows.
    assert c[0, B] > ROWS[0, -3:].mean(0)[B] + 0.01 or c[0, A] > ROWS[0, -3:].mean(0)[A] + 0.01
    # lam = 0 is the no-walk variant: w = a.
    _, _, w0 = nexus_weights(ROWS, walk_steps=3, lam=0.0, eps_tie=0.0)
    assert torch.equal(w0, a)


def _cluster_view(make_view, lam, n=math.inf):
    """Blocks of 4 entries: sink, X, A, B, D, recent, then 5 window entries outside any block.
    Each block's keys point along its own axis; window queries point at the blocks of ROWS, so
    the block-normalised rows are ROWS to within exp(-20)."""
    blk, d = 4, 8
    block_of = [0] * blk + [1] * blk + [2] * blk + [3] * blk + [4] * blk + [5] * blk
    n_entries = len(block_of) + 5
    keys = torch.zeros(1, 2, n_entries, d)
    for i, bid in enumerate(block_of):
        if 1 <= bid <= 4:
            keys[0, :, i, bid] = 1.0
    queries = torch.zeros(1, 4, 5, d)
    for t in range(5):
        queries[0, :, t, 1:5] = 20.0 * ROWS[0, t] * 2  # 0.5 -> 20, 1.0 -> 40
    ids = torch.tensor(block_of + [-1] * 5)
    view = make_view(keys, queries, scaling=1.0, block_ids=ids)
    pol = make_policy("nexus", block=blk, lam=lam, n=n, eps_tie=0.0)
    return view, pol


def test_walk_changes_the_kept_block_end_to_end(make_view):
    best = {}
    for lam in (0.0, 0.5):
        view, pol = _cluster_view(make_view, lam)
        rows = block_rows(view, 6)
        assert torch.allclose(rows[0, :, 1:5], ROWS[0], atol=1e-6)
        prio = pol.block_priorities(view)[0]
        assert torch.isinf(prio[0]) and torch.isinf(prio[5])  # sink and recent block forced
        best[lam] = int(prio[1:5].argmax()) + 1
        s = pol.scores(view)
        assert s.shape == (1, 1, view.n_entries)
    assert best[0.0] == 1 + X
    assert best[0.5] == 1 + B


def _direct_log_priority(w, n, seed):
    g = torch.Generator().manual_seed(seed)
    u = torch.rand((w.shape[0], n, w.shape[1]), generator=g, dtype=torch.float64)
    return torch.log((u ** (1.0 / w.double()[:, None, :])).mean(dim=1))


def test_log_priority_equals_direct_formula():
    w = torch.tensor([[0.3, 0.5, 1.0, 2.0, 3.0], [0.4, 0.8, 1.5, 0.35, 2.5]])
    for seed in range(5):
        for n in (1, 5, 17):
            got = log_priority(w, n, torch.Generator().manual_seed(seed))
            assert torch.allclose(got, _direct_log_priority(w, n, seed), atol=1e-10)


def test_log_priority_survives_underflow():
    w = torch.tensor([[1e-6, 2e-6, 4e-6]])
    direct = _direct_log_priority(w, 5, 0)
    assert torch.isinf(direct).all()  # u^(1/w) underflows: the direct formula ties everything
    got = log_priority(w, 5, torch.Generator().manual_seed(0))
    assert torch.isfinite(got).all()
    assert len(set(got[0].tolist())) == 3


def test_large_n_is_topk_by_w():
    w = torch.tensor([[0.9, 0.1, 1.3, 0.5, 1.5, 0.3, 1.1, 0.7]])
    top = set(w[0].topk(3).indices.tolist())
    for n in (math.inf, 0):
        lp = log_priority(w, n, torch.Generator().manual_seed(0))
        assert torch.allclose(lp, torch.log(w.double() / (1 + w.double())))
    for seed in range(5):
        lp = log_priority(w, 20000, torch.Generator().manual_seed(seed))
        assert set(lp[0].topk(3).indices.tolist()) == top


def test_n1_inclusion_monotone_in_w():
    w = torch.tensor([[0.2, 0.4, 0.8, 1.6, 3.2]])
    counts = torch.zeros(5)
    for seed in range(3000):
        lp = log_priority(w, 1, torch.Generator().manual_seed(seed))
        counts[lp[0].topk(2).indices] += 1
    freq = counts / 3000
    assert (freq[1:] - freq[:-1] > 0.03).all(), freq
    assert freq[0] > 0.05 and freq[-1] < 0.99  # sampled, not deterministic


def test_n1_is_scale_free_and_normalize_keeps_order():
    # A-Res depends only on ratios of w; and the deterministic order is unchanged by a rescale.
    w = torch.tensor([[0.01, 0.02, 0.05, 0.03]])
    a = log_priority(w, 1, torch.Generator().manual_seed(3))
    b = log_priority(w * 40, 1, torch.Generator().manual_seed(3))
    assert torch.equal(a[0].argsort(), b[0].argsort())


def _block_view(rand_view, seed=0, n=44, blk=4, first=2, positions=None):
    ids = torch.full((n,), -1)
    ids[first : first + 32] = torch.arange(32) // blk  # 8 candidate blocks; the rest is -1
    return rand_view(n=n, w=4, seed=seed, block_ids=ids, positions=positions)


def _prio(scores, ids, nb=8):
    return torch.stack([scores[0, 0, ids == i][0] for i in range(nb)])


def test_forced_blocks_and_block_uniform_scores(rand_view):
    for seed in range(20):
        # Entries 0, 1 protected: positions 2, 3 (< sink_blocks * block = 4) sit in block 0.
        view = _block_view(rand_view, seed)
        s = make_policy("nexus", block=4).scores(view)
        assert s.shape == (1, 1, 44)  # one keep-set for all heads
        ids = view.block_ids
        assert torch.isinf(s[0, 0, ids == -1]).all()
        assert torch.isinf(s[0, 0, (ids == 0) | (ids == 7)]).all()  # sink block, newest block
        mid = s[0, 0, (ids >= 1) & (ids <= 6)].reshape(6, 4)
        assert torch.isfinite(mid).all()
        assert (mid == mid[:, :1]).all()  # every entry carries its block's priority
    s = make_policy("nexus", block=4, sink_blocks=0, recent_blocks=2).scores(view)
    prio = _prio(s, view.block_ids)
    assert torch.isinf(prio[6:]).all() and torch.isfinite(prio[:6]).all()


def test_sink_blocks_follow_positions(rand_view):
    # A protected prompt already holds the sink: no candidate block is forced for it.
    view = _block_view(rand_view, first=10)
    prio = _prio(make_policy("nexus", block=4).scores(view), view.block_ids)
    assert torch.isfinite(prio[:7]).all() and torch.isinf(prio[7])
    # After earlier rounds the sink positions 0..7 (sink_blocks=2) straddle blocks 0-2 of the new
    # partition: all three are forced, block 3 is not.
    pos = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 9, 11] + list(range(20, 54))).expand(1, 2, 44).clone()
    view = _block_view(rand_view, first=0, positions=pos)
    view.block_ids = torch.cat([torch.tensor([0, 0, 1, 1, 1, 1, 2, 2]), torch.arange(8, 44) // 4 + 1])[:44]
    view.block_ids[view.block_ids > 9] = -1
    prio = _prio(make_policy("nexus", block=4, sink_blocks=2).scores(view), view.block_ids, nb=10)
    assert torch.isinf(prio[:3]).all() and torch.isfinite(prio[3:9]).all() and torch.isinf(prio[9])


def test_nexus_deterministic_variant_follows_w(rand_view):
    view = _block_view(rand_view, seed=5)
    pol = make_policy("nexus", block=4, n=math.inf, eps_tie=1e-6)
    prio = pol.block_priorities(view)[0]
    _, _, w = nexus_weights(block_rows(view, 8), 3, 0.5, 1e-6)
    mid = slice(1, 7)
    assert torch.equal(prio[mid].argsort(), w[0, mid].argsort())
    norm = make_policy("nexus", block=4, n=math.inf, normalize=True).block_priorities(view)[0]
    assert torch.equal(norm[mid].argsort(), prio[mid].argsort())


def test_nexus_bad_args(rand_view):
    for bad in ({"block": 0}, {"n": -1}, {"n": 2.5}, {"lam": -0.1}, {"walk_steps": 1.5}, {"normalize": 1}):
        with pytest.raises(ConfigError, match=f"policy_args.{next(iter(bad))}"):
            make_policy("nexus", **bad)
    with pytest.raises(ConfigError, match="nexus has no option"):
        make_policy("nexus", temperature=1.0)
    with pytest.raises(ValueError, match="block_ids"):
        make_policy("nexus").scores(rand_view())
