"""Audit analyses (Random Attention paper, App. D) on hand-built rounds with known answers."""

import math

import pytest
import torch

from kvagent.runtime.audit import AuditRound, analyse, cross_head_coverage, prompt_survival, survival_by_age


def _r(rnd, layer, length, prompt, kept):
    return AuditRound(
        round=rnd, layer=layer, logical_length=length, prompt_length=prompt, kept=torch.tensor(kept)
    )


def test_prompt_survival():
    rounds = [
        # prompt 0..3: head 0 keeps {0, 1}, head 1 keeps {1, 2}: union 3/4, per head 2/4.
        _r(0, 0, 10, 4, [[0, 1, 8, 9], [1, 2, 7, 9]]),
        # later round: head 0 {0}, head 1 {0}: union 1/4, per head 1/4.
        _r(1, 0, 20, 4, [[0, 15, 18, 19], [0, 12, 17, 19]]),
        _r(0, 1, 10, 0, [[5, 6], [7, 8]]),  # no prompt: ignored
    ]
    out = prompt_survival(rounds)
    assert out["union"] == pytest.approx((0.75 + 0.25) / 2)
    assert out["per_head"] == pytest.approx((0.5 + 0.25) / 2)
    assert out["final_union"] == pytest.approx(0.25)  # layer 0's last round only
    assert len(out["rows"]) == 2


def test_survival_by_age_bands():
    # length 10, no prompt; ages = 10 - position. Bands [0,3) -> ages 1,2; [3,6) -> 3,4,5; [6,inf) -> 6..10.
    r = _r(0, 0, 10, 0, [[9, 8, 5, 0], [9, 6, 4, 1]])
    out = survival_by_age([r], bands=[0, 3, 6, math.inf], exclude_prompt=True)
    assert out["count"] == [2, 3, 5]
    # head 0 ages {1, 2, 5, 10}, head 1 ages {1, 4, 6, 9}
    assert out["per_head"] == pytest.approx([(2 + 1) / 2 / 2, (1 + 1) / 2 / 3, (1 + 2) / 2 / 5])
    assert out["union"] == pytest.approx([2 / 2, 2 / 3, 3 / 5])
    assert out["bands"][-1] == [6.0, None]


def test_survival_by_age_excludes_prompt_and_pools():
    # prompt 0..1 protected and kept; eligible positions 2..9 (ages 1..8).
    r1 = _r(0, 0, 10, 2, [[0, 1, 9, 3], [0, 1, 8, 2]])
    r2 = _r(0, 1, 10, 2, [[0, 1, 9, 8], [0, 1, 9, 8]])
    out = survival_by_age([r1, r2], bands=[1, 5, 100])
    assert out["count"] == [8, 8]  # ages 1..4 and 5..8 (capped at length - prompt), twice
    # band [1,5): r1 h0 {1}, h1 {2}; r2 both {1, 2}  -> per head (1+1)/2 + (2+2)/2 = 3 of 8
    assert out["per_head"][0] == pytest.approx(3 / 8)
    assert out["union"][0] == pytest.approx((2 + 2) / 8)
    # band [5,100): r1 h0 {7}, h1 {8}; r2 none -> per head 1 of 8, union 2 of 8
    assert out["per_head"][1] == pytest.approx(1 / 8)
    assert out["union"][1] == pytest.approx(2 / 8)
    incl = survival_by_age([r1, r2], bands=[1, 5, 100], exclude_prompt=False)
    assert incl["count"] == [8, 12]
    assert incl["per_head"][1] == pytest.approx((1 + 2 + 2) / 12)


def test_cross_head_coverage():
    shared = _r(0, 0, 12, 0, [[0, 3, 7, 11]] * 3)
    diverse = _r(1, 0, 12, 0, [[0, 3, 7, 11], [1, 4, 8, 11], [2, 5, 9, 11]])
    out = cross_head_coverage([shared])
    assert out["union"] == pytest.approx(4 / 12) and out["per_head"] == pytest.approx(4 / 12)
    assert out["gain"] == pytest.approx(1.0)
    out = cross_head_coverage([diverse])
    assert out["union"] == pytest.approx(10 / 12)
    assert out["gain"] == pytest.approx(2.5)


def test_analyse_entry_point_and_batch_dim():
    r = AuditRound(round=0, layer=0, logical_length=8, prompt_length=2, kept=torch.tensor([[[0, 1, 6, 7]]]))
    out = analyse([r])
    assert out["n_rounds"] == 1 and out["layers"] == [0]
    assert out["prompt_survival"]["union"] == 1.0
    assert out["coverage"]["union"] == pytest.approx(0.5)
    assert set(out) == {"n_rounds", "layers", "prompt_survival", "survival_by_age", "coverage"}
    empty = analyse([])
    assert empty["prompt_survival"]["union"] is None
    with pytest.raises(ValueError, match="bands"):
        survival_by_age([r], bands=[5, 1])


def test_pad_entries_are_not_held_positions():
    """After Session.forget a shorter head starts with PAD entries (-1): they hold nothing."""
    r = _r(0, 0, 10, 4, [[-1, -1, 0, 9], [0, 1, 2, 9]])
    assert prompt_survival([r])["per_head"] == pytest.approx((1 / 4 + 3 / 4) / 2)
    cov = cross_head_coverage([r])
    assert cov["per_head"] == pytest.approx((2 / 10 + 4 / 10) / 2)
    assert cov["union"] == pytest.approx(4 / 10)
    ages = survival_by_age([r], bands=(0, 100), exclude_prompt=False)
    assert ages["per_head"][0] == pytest.approx((2 + 4) / 2 / 10)
