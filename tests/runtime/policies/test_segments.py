"""The segment-aware policy: a scorer's token scores aggregated per marked segment, whole segments
kept (at most one, the last that fits, in part), the prompt (before the first mark) and the newest
segment always kept; exact against the masked-attention oracle with marks, in both frameworks."""

from __future__ import annotations

import pytest
import torch

from kvagent.errors import ConfigError
from kvagent.runtime import CacheConfig
from kvagent.runtime.oracle import check_session_against_oracle, random_episode, trace
from kvagent.runtime.policies import make_policy
from kvagent.runtime.round import select

from .conftest import random_view

STARTS = [8, 16, 24, 32]  # prompt 0-7, segments 8-15, 16-23, 24-31, 32-39 (the newest)


def segments_of(kept: set[int]) -> dict[int, int]:
    """Entries kept per segment (-1: the prompt)."""
    out: dict[int, int] = {}
    for p in kept:
        s = max([i for i, a in enumerate(STARTS) if a <= p], default=-1)
        out[s] = out.get(s, 0) + 1
    return out


@pytest.mark.parametrize("scorer", ["snapkv", "knorm", "random"])
def test_whole_segments_by_their_mean_score(scorer):
    view = random_view(n=40, budget=20, seed=3)
    view.segment_starts = torch.tensor(STARTS)
    pol = make_policy("segments", scorer=scorer)
    kept = select(pol, view)[0]
    token = make_policy(scorer).scores(random_view(n=40, budget=20, seed=3))[0].float()  # the same draws
    for h, row in enumerate(kept):
        per = segments_of(set(row.tolist()))
        assert per[-1] == 8 and per[3] == 8  # the prompt and the newest segment, whole
        sizes = [per.get(s, 0) for s in range(3)]  # 4 entries left for the 3 scored segments of 8
        assert sorted(sizes) == [0, 0, 4]
        hh = h if token.shape[0] > 1 else 0
        means = [float(token[hh, STARTS[s] : STARTS[s + 1]].mean()) for s in range(3)]
        assert sizes.index(4) == max(range(3), key=lambda s: means[s])  # the best mean wins
        part = STARTS[sizes.index(4)]
        assert set(row.tolist()) >= set(range(part + 4, part + 8))  # its newest entries


def test_budget_fitting_two_segments_keeps_them_whole_and_no_marks_is_the_scorer():
    view = random_view(n=40, budget=32, seed=4)
    view.segment_starts = torch.tensor(STARTS)
    for row in select(make_policy("segments"), view)[0]:
        assert sorted(segments_of(set(row.tolist())).values()) == [8, 8, 8, 8]
    view.segment_starts = None
    assert torch.equal(make_policy("segments").scores(view), make_policy("snapkv").scores(view))


def test_the_scorer_and_reduce_knobs_are_checked():
    for bad in ({"scorer": "nexus"}, {"scorer": "triattention"}, {"scorer": "h2o"}, {"reduce": "sum"}):
        with pytest.raises(ConfigError):
            make_policy("segments", **bad)
    assert make_policy("segments", reduce="max").reduce == "max"


@pytest.mark.parametrize("framework", ["recent-buffer", "topk-all"])
@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_marked_segments_match_masked_full_attention(tiny_engines, kind, framework):
    cfg = CacheConfig(policy="segments", budget=64, buffer=16, protect="prompt", seed=5, framework=framework)
    session = tiny_engines[kind].session(cfg)
    # random_episode's turns: a prompt of 24, then decode runs of 15 + 5t and appends of 30 + 17t
    pos, marks = 24, []
    for t in range(3):
        marks += [pos, pos + 15 + 5 * t]
        pos += 15 + 5 * t + 30 + 17 * t
    for p in marks:
        session.mark_segment(p)
    with trace(session) as records:
        random_episode(session, vocab=512, turns=3)
    assert session.stats.rounds > 2
    assert check_session_against_oracle(session, records) < 1e-4
    held = [set(h.tolist()) for layer in session.kept_positions() for h in layer[0]]
    assert all(set(range(24)) <= h for h in held)  # the prompt


@pytest.mark.parametrize("attention", ["sdpa", "split"])
def test_marked_segments_static_step_equals_eager(tiny_engines, attention):
    """The static decode step's numbers with segment rounds (marks, a forget, a rewind, appends)."""
    from tests.runtime.test_static_step import STEPS, _pair, _script

    engines = _pair(tiny_engines, attention=attention)
    runs = {}
    for mode, engine in engines.items():
        s = engine.session(CacheConfig(policy="segments", budget=24, buffer=8, protect="sink"))
        for p in range(40, 40 + STEPS, 23):  # a segment every 23 tokens
            s.mark_segment(p)
        runs[mode] = (s, _script(s, seed=7))
    (e_s, e_logits), (s_s, s_logits) = runs["eager"], runs["static"]
    assert engines["static"].step_runner.steps > STEPS // 2
    assert e_s.stats.rounds == s_s.stats.rounds > 5
    for a, b in zip(e_logits, s_logits, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    for a, b in zip(e_s.kept_positions(), s_s.kept_positions(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("mode", ["persistent", "reprefill"])
def test_marks_follow_the_history_through_forget_and_rewind(tiny_engines, mode):
    """A mark names where a segment starts in the history as it is now: a reprefill forget shifts
    later marks down (one on a dropped token moves to the next kept one), a persistent forget keeps
    positions; a rewind drops the marks past the cut (one at the cut starts what is fed next)."""
    s = tiny_engines["qwen3"].session(CacheConfig(policy="segments", budget=64, buffer=16, mode=mode))
    s.append(list(range(1, 9)))  # the prompt: rewind never reaches into it
    s.append(list(range(9, 61)))
    for p in (10, 20, 30, 40, 40, 50):  # marking twice is marking once
        s.mark_segment(p)
    assert s.segment_starts == (10, 20, 30, 40, 50)
    s.forget([3, 20, 21, 35])
    want = (10, 20, 30, 40, 50) if mode == "persistent" else (9, 19, 27, 36, 46)
    assert s.segment_starts == want
    s.append([7] * 5)
    s.rewind(s.logical_length - want[2])
    assert s.segment_starts == want[:3]
    s.append([8] * 4)
    assert s.segment_starts == want[:3] and s.logical_length == want[2] + 4
