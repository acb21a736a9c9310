"""H2O's lazily accumulated score against brute-force per-step attention."""

import pytest
import torch

from kvagent.errors import ConfigError
from kvagent.runtime.policies import make_policy
from kvagent.runtime.policies.base import LayerView

HKV, G, D = 2, 2, 8


def _step_attention(q, keys, positions, p, scaling):
    """One query head's softmax over the listed entries with position <= p (explicit)."""
    vis = [i for i, pos in enumerate(positions) if pos <= p]
    logits = torch.stack([q @ keys[i] for i in vis]) * scaling
    return dict(zip(vis, torch.softmax(logits, dim=0).tolist(), strict=True))


class _Cache:
    """A per-head list cache with brute-force accumulated attention, plus the runtime's bookkeeping
    (pending queries, gather at compaction, zero-padding of state for new entries)."""

    def __init__(self):
        self.keys = [[] for _ in range(HKV)]
        self.pos = [[] for _ in range(HKV)]
        self.brute = [[] for _ in range(HKV)]
        self.pending_q, self.pending_p = [], []
        self.state = {}

    def feed(self, k, q, p, scaling):
        # The token's key enters the cache before its query attends (the window is in the cache).
        for h in range(HKV):
            self.keys[h].append(k[h])
            self.pos[h].append(p)
            self.brute[h].append(0.0)
        for qh in range(HKV * G):
            h = qh // G
            for i, a in _step_attention(q[qh], self.keys[h], self.pos[h], p, scaling).items():
                self.brute[h][i] += a
        self.pending_q.append(q)
        self.pending_p.append(p)

    def view(self, budget):
        n = len(self.pos[0])
        per_entry = self.state.get("per_entry", {})
        if "acc" in per_entry:  # zero-pad for entries appended since the last round
            acc = per_entry["acc"]
            per_entry["acc"] = torch.cat([acc, acc.new_zeros((1, HKV, n - acc.shape[-1]))], dim=-1)
        return LayerView(
            keys=torch.stack([torch.stack(k) for k in self.keys])[None],
            values=torch.zeros(1, HKV, n, D),
            positions=torch.tensor(self.pos)[None],
            queries=torch.stack(self.pending_q[-4:], dim=1)[None],
            query_positions=torch.tensor(self.pending_p[-4:]),
            layer_idx=0,
            n_layers=1,
            group_size=G,
            scaling=D**-0.5,
            generator=torch.Generator().manual_seed(0),
            budget=budget,
            protected=torch.zeros(1, HKV, n, dtype=torch.bool),
            pending_queries=torch.stack(self.pending_q, dim=1)[None],
            pending_positions=torch.tensor(self.pending_p),
            state=self.state,
        )

    def absorb(self, policy):
        policy.absorb(self.view(budget=0))
        self.pending_q, self.pending_p = [], []

    def round(self, policy, budget):
        s = policy.scores(self.view(budget))
        self.pending_q, self.pending_p = [], []
        keep = s[0].topk(budget, dim=-1).indices.sort(dim=-1).values  # (HKV, K)
        acc = self.state["per_entry"]["acc"]
        self.state["per_entry"]["acc"] = acc.gather(-1, keep[None])
        for h in range(HKV):
            idx = keep[h].tolist()
            self.keys[h] = [self.keys[h][i] for i in idx]
            self.pos[h] = [self.pos[h][i] for i in idx]
            self.brute[h] = [self.brute[h][i] for i in idx]
        return s

    def check(self):
        acc = self.state["per_entry"]["acc"][0]
        want = torch.tensor(self.brute)
        assert acc.shape == want.shape
        assert torch.allclose(acc, want, atol=1e-5), (acc - want).abs().max()


def test_h2o_lazy_accumulation_equals_brute_force():
    g = torch.Generator().manual_seed(7)
    pol = make_policy("h2o", recent=0.0)
    cache = _Cache()
    scaling = D**-0.5
    p = 0
    # Prefill chunk, decode, absorb mid-way, a round (per-head evictions), more decode, another round.
    schedule = [
        ("feed", 12),
        ("absorb", 0),
        ("feed", 6),
        ("round", 10),
        ("feed", 5),
        ("absorb", 0),
        ("feed", 4),
    ]
    for op, arg in schedule:
        if op == "feed":
            for _ in range(arg):
                # Scaled so the softmax is peaked and heads disagree on what to keep.
                k = 2 * torch.randn((HKV, D), generator=g)
                q = 2 * torch.randn((HKV * G, D), generator=g)
                cache.feed(k, q, p, scaling)
                p += 1
        elif op == "absorb":
            cache.absorb(pol)
            cache.check()
        else:
            s = cache.round(pol, arg)
            cache.check()
    # The round evicted different entries per head.
    assert cache.pos[0] != cache.pos[1]
    # Final round: the scores are exactly the accumulated attention.
    s = pol.scores(cache.view(8))
    cache.pending_q, cache.pending_p = [], []
    cache.check()
    assert torch.equal(s, cache.state["per_entry"]["acc"])


def test_h2o_recent_forced(rand_view):
    view = rand_view(
        n=30, w=3, budget=10, pending_queries=torch.randn(1, 4, 5, 8), pending_positions=torch.arange(25, 30)
    )
    s = make_policy("h2o").scores(view)  # recent = 0.5 * budget = 5 newest entries per head
    assert torch.isfinite(s).all()  # finite: protection (+inf in the runtime) must still win
    assert (s[..., -5:].amin(-1) > s[..., :-5].amax(-1)).all()


def test_h2o_state_shape_mismatch_is_clear(rand_view):
    view = rand_view(n=10, pending_queries=torch.randn(1, 4, 2, 8), pending_positions=torch.arange(8, 10))
    view.state["per_entry"] = {"acc": torch.zeros(1, 2, 9)}
    with pytest.raises(ValueError, match="gather and pad"):
        make_policy("h2o").scores(view)


def test_h2o_bad_args():
    with pytest.raises(ConfigError, match="policy_args.recent"):
        make_policy("h2o", recent=2)
    with pytest.raises(ConfigError, match="h2o has no option"):
        make_policy("h2o", heavy=0.5)
