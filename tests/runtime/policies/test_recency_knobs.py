"""A policy's own recency keep (SnapKV's window, H2O's recent share, ...) is the eviction
framework's unless given (issue #26): on under topk-all, off under recent-buffer."""

from __future__ import annotations

import pytest
import torch

from kvagent.runtime.policies import make_policy
from kvagent.runtime.round import block_partition

# (policy, knob, its value under topk-all, off) for every policy's own recency keep
RECENCY_KNOBS = [
    ("snapkv", "keep_window", True, False),
    ("pyramidkv", "keep_window", True, False),
    ("rkv", "keep_window", True, False),
    ("morphkv", "keep_window", True, False),
    ("h2o", "recent", 0.5, 0.0),
    ("triattention", "recent", 128, 0),
    ("nexus", "recent_blocks", 1, 0),
]


@pytest.mark.parametrize("policy, knob, legacy, off", RECENCY_KNOBS)
def test_recency_knobs_are_the_frameworks_unless_given(rand_view, policy, knob, legacy, off):
    """Left out, a policy's own recency keep is on under topk-all (view.recent_buffer == 0) and off under
    recent-buffer (view.recent_buffer > 0: the runtime keeps the newest entries for every policy); given,
    it holds in both."""
    extra = (
        {"block": 4} if policy == "nexus" else {"rope_theta": 10_000.0} if policy == "triattention" else {}
    )

    def scores(buffer: int, **knobs):
        view = rand_view(n=48, w=4, budget=24, seed=1)
        view.recent_buffer = buffer
        if policy == "nexus":
            view.block_ids = block_partition(48, 0, 4, "cpu", buffer)
        return make_policy(policy, **extra, **knobs).scores(view)

    assert getattr(make_policy(policy, **extra), knob) is None
    for buffer in (0, 8):
        decided, other = (legacy, off) if buffer == 0 else (off, legacy)
        torch.testing.assert_close(scores(buffer), scores(buffer, **{knob: decided}))
        assert not torch.equal(scores(buffer), scores(buffer, **{knob: other}))  # a given value holds
