"""The eviction framework (issue #26): `recent-buffer`, both papers' (the newest r entries of every
head are never scored; a round every r tokens once a head holds K + 2r keeps the top K of the rest),
and `topk-all`, kvagent's before it (a round at K + r keeps the top K of every entry), which must stay
exactly what it was: the same keep-sets and logits as the fingerprints recorded from the old code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kvagent.errors import ConfigError
from kvagent.runtime import CacheConfig
from kvagent.runtime.budget import prompt_fit_problem
from kvagent.runtime.policies import available

from .topk_reference import cases, fingerprint

REFERENCE = json.loads((Path(__file__).parent / "data" / "topk_all_reference.json").read_text())
# One case per policy runs always; every other recorded case (defaults, reprefill, Llama, protect,
# scope, fractions, adaptive heads, forget) with the slow tests.
QUICK = [f"qwen3/{p}-persistent" for p in available() if p != "full"]
SLOW = [k for k in REFERENCE if k not in QUICK]


def test_every_evicting_policy_has_a_reference():
    assert sorted({k.split("/")[1].split("-")[0] for k in REFERENCE}) == sorted(set(available()) - {"full"})


def _same_as_before(tiny_engines, key):
    kind, name = key.split("/")
    got = fingerprint(tiny_engines[kind], cases()[name], framework="topk-all")
    ref = REFERENCE[key]
    assert (got["rounds"], got["evicted"]) == (ref["rounds"], ref["evicted"])
    assert got["kept"] == ref["kept"], "the keep-sets differ from the old code's"
    # A mark sums a random projection of up to 81 x 512 logits, so it keeps the absolute rounding
    # of terms far larger than itself: on another machine than the one that recorded them (an AMD
    # EPYC), float32 kernels moved 3 of ~500 marks by up to 3.9e-4.
    # The keep-sets above are compared exactly; a wrong cache moves the marks by far more than 1e-3.
    torch.testing.assert_close(torch.tensor(got["logits"]), torch.tensor(ref["logits"]), atol=1e-3, rtol=1e-5)


@pytest.mark.parametrize("key", QUICK)
def test_topk_all_is_the_old_eviction(tiny_engines, key):
    _same_as_before(tiny_engines, key)


@pytest.mark.slow
@pytest.mark.parametrize("key", SLOW)
def test_topk_all_is_the_old_eviction_in_every_recorded_case(tiny_engines, key):
    _same_as_before(tiny_engines, key)


# ----------------------------------------------------------------- recent-buffer
K, R = 96, 16


def _episode(session, g: torch.Generator, turns: int, prompt: int = 40) -> None:
    """A prompt, then decode runs alternating with observations, with lengths that are no multiples
    of r, so rounds fall inside chunks as well as at step boundaries."""
    session.append(torch.randint(0, 512, (prompt,), generator=g).tolist())
    for t in range(turns):
        for tok in torch.randint(0, 512, (23 + 7 * (t % 3),), generator=g).tolist():
            session.step(tok)
        session.append(torch.randint(0, 512, (61 + 13 * (t % 4),), generator=g).tolist())


def _newest_kept(audit) -> tuple[int, int]:
    """(newest-r positions held, newest-r positions there were) over every round, layer and head."""
    held = total = 0
    for rec in audit:
        if rec.forced:
            continue
        newest = torch.arange(rec.logical_length - R, rec.logical_length)
        for head in rec.kept:
            held += int(torch.isin(newest, head).sum())
            total += R
    return held, total


@pytest.mark.parametrize("mode", ["persistent", "reprefill"])
@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_random_keeps_every_newest_r_token_at_every_round(tiny_engines, kind, mode):
    """The papers' framework: at every round every layer and head holds the newest r positions. The
    old framework does not (random scores the newest entries like any other)."""
    engine = tiny_engines[kind]
    share = {}
    for framework in ("recent-buffer", "topk-all"):
        cfg = CacheConfig(policy="random", budget=K, buffer=R, mode=mode, protect="prompt", seed=2,
                          audit=True, framework=framework)  # fmt: skip
        session = engine.session(cfg)
        _episode(session, torch.Generator().manual_seed(4), turns=6)
        rounds = [a for a in session.audit if not a.forced]
        assert len({a.round for a in rounds}) >= 6, "the episode must evict"
        held, total = _newest_kept(rounds)
        share[framework] = held / total
    assert share["recent-buffer"] == 1.0
    assert share["topk-all"] < 0.9  # about K / (K + r) of them, as a uniform draw keeps


@pytest.mark.parametrize("framework, peak", [("recent-buffer", K + 2 * R), ("topk-all", K + R)])
def test_peak_entries_over_a_4k_token_episode(tiny_engines, framework, peak):
    """Memory is honest: one head of one layer never holds more than K + 2r (recent-buffer) or K + r
    (topk-all) entries, as the session's stats say, and after each round it holds K + r (or K)."""
    session = tiny_engines["qwen3"].session(
        CacheConfig(policy="snapkv", budget=K, buffer=R, protect="sink", framework=framework)
    )
    _episode(session, torch.Generator().manual_seed(9), turns=36)
    stats = session.stats
    assert stats.logical_length >= 4000
    assert stats.peak_entries == peak  # reached, never passed
    assert stats.rounds >= (stats.logical_length - peak) // R
    assert max(stats.entries) <= peak


def test_a_prompt_must_fit_k_not_k_plus_2r():
    """The recent buffer is outside K, so the rule is the old one (protected < K); a fraction's first
    round comes later under recent-buffer (at K(L) + 2r), where K(L) has grown."""
    for framework in ("recent-buffer", "topk-all"):
        fits = CacheConfig(policy="random", budget=96, buffer=16, framework=framework)
        assert prompt_fit_problem(fits, 95) is None
        assert "protects all 96 prompt tokens" in prompt_fit_problem(fits, 96)
    # budget 0.5, r 16: topk-all's first round is at 32 tokens (K = 16), recent-buffer's at 64 (K = 32)
    frac = {
        f: CacheConfig(policy="random", budget=0.5, buffer=16, framework=f)
        for f in ("recent-buffer", "topk-all")
    }
    assert prompt_fit_problem(frac["topk-all"], 20) is not None
    assert prompt_fit_problem(frac["recent-buffer"], 20) is None
    assert prompt_fit_problem(frac["recent-buffer"], 32) is not None


def test_block_policies_take_a_buffer_of_whole_blocks():
    with pytest.raises(ConfigError, match=r"^buffer: 16 is not a multiple of nexus's block 32 .*--buffer 32"):
        CacheConfig(policy="nexus", budget=128, buffer=16)
    CacheConfig(policy="nexus", budget=128, buffer=16, framework="topk-all")  # its forced block instead
    CacheConfig(policy="nexus", budget=128, buffer=64)
    CacheConfig(policy="nexus", budget=128, buffer=16, policy_args={"block": 8})
    with pytest.raises(
        ConfigError, match=r"^framework: got 'papers'; choose one of recent-buffer, topk-all$"
    ):
        CacheConfig(policy="random", budget=128, framework="papers")


def test_pyramidkv_takes_the_cache_window(tiny_engines):
    engine = tiny_engines["qwen3"]
    assert engine.session(CacheConfig(policy="pyramidkv", budget=64, window=8)).policy.window == 8
    given = CacheConfig(policy="pyramidkv", budget=64, window=8, policy_args={"window": 4})
    assert engine.session(given).policy.window == 4
