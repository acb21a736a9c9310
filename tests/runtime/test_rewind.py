"""Session.rewind(n): the newest n tokens leave the stream, so the next append continues at
logical_length - n with no gap. A full cache then equals a fresh session fed the final stream (both
modes); under eviction the masked-attention oracle holds on the final stream; batched equals solo."""

from __future__ import annotations

import pytest
import torch

from kvagent.errors import ConfigError
from kvagent.runtime import CacheConfig, Sampling
from kvagent.runtime.oracle import check_session_against_oracle, trace

from .batching import assert_same_logits_and_kept, run_alone, run_together

VOCAB = 512
TOL = 1e-4

POLICIES = {
    "random": {},
    "snapkv": {},
    "h2o": {},
    "nexus": {"block": 8},
    "tova": {},
}


def rand_ids(n: int, g: torch.Generator) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


def config(policy: str, mode: str = "persistent", seed: int = 4, **kw) -> CacheConfig:
    kw.setdefault("budget", None if policy == "full" else 64)
    kw.setdefault("protect", "prompt")
    return CacheConfig(
        policy=policy, buffer=16, mode=mode, seed=seed, policy_args=POLICIES.get(policy, {}), audit=True, **kw
    )


def episode(session, seed: int = 0) -> list[torch.Tensor]:
    """prompt, a reply, an observation; take back part of both and re-send them differently; a
    reply rewound whole right after it was decoded and redone; a last observation. Returns the
    logits of every call (rewinds return none)."""
    g = torch.Generator().manual_seed(seed)
    out = [session.append(rand_ids(20, g), all_logits=True)]
    out += [session.step(t) for t in rand_ids(40, g)]
    out.append(session.append(rand_ids(50, g), all_logits=True))
    assert session.rewind(65) == 65  # all of the observation and the reply's last 15 tokens
    out.append(session.append(rand_ids(70, g), all_logits=True))
    reply = rand_ids(30, g)
    out += [session.step(t) for t in reply]
    session.rewind(len(reply))
    out.append(session.append(rand_ids(25, g), all_logits=True))
    out += [session.step(t) for t in rand_ids(10, g)]
    return out


def final_stream(seed: int = 0) -> list[int]:
    """The token stream `episode(seed)` leaves."""
    g = torch.Generator().manual_seed(seed)
    prompt, reply, obs = rand_ids(20, g), rand_ids(40, g), rand_ids(50, g)
    del obs
    resent = rand_ids(70, g)
    rand_ids(30, g)
    return prompt + reply[:25] + resent + rand_ids(25, g) + rand_ids(10, g)


@pytest.mark.parametrize("mode", ["persistent", "reprefill"])
@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_full_cache_rewind_then_append_equals_a_fresh_session_fed_the_final_stream(tiny_engines, kind, mode):
    engine = tiny_engines[kind]
    cfg = config("full", mode=mode)
    session = engine.session(cfg)
    g = torch.Generator().manual_seed(1)
    prompt, reply, obs = rand_ids(20, g), rand_ids(30, g), rand_ids(40, g)
    session.append(prompt)
    for t in reply:
        session.step(t)
    session.append(obs)
    assert session.rewind(50) == 50
    assert session.logical_length == 40 and session.history == prompt + reply[:20]
    assert session.stats.rewound == 50
    tail = rand_ids(35, g)
    got = session.append(tail, all_logits=True)
    assert session.logical_length == len(session.history) == 75
    fresh = engine.session(cfg)
    fresh.append(prompt)
    want = fresh.append(reply[:20] + tail, all_logits=True)
    torch.testing.assert_close(got, want[-len(tail) :], atol=1e-5, rtol=1e-5)
    for a, b in zip(session.kept_positions(), fresh.kept_positions(), strict=True):
        assert torch.equal(a, b)
    assert session.generate(6, sampling=Sampling()).ids == fresh.generate(6, sampling=Sampling()).ids


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_rewind_under_eviction_matches_masked_full_attention(tiny_engines, kind, policy):
    engine = tiny_engines[kind]
    session = engine.session(config(policy))
    with trace(session) as records:
        episode(session)
    assert session.history == final_stream()
    assert [t for r in records for t in r.ids] == session.history  # the oracle runs the final stream
    assert check_session_against_oracle(session, records) < TOL
    assert session.stats.rounds > 2, "the episode must also evict"
    assert session.stats.rewound == 95
    assert any(r.forced for r in session.audit)


@pytest.mark.parametrize("policy", ["snapkv", "h2o"])
def test_rewind_with_adaptive_head_budgets_matches_masked_full_attention(qwen3_engine, policy):
    session = qwen3_engine.session(config(policy, head_budget="adaptive"))
    with trace(session) as records:
        episode(session, seed=3)
    assert check_session_against_oracle(session, records) < TOL
    assert session.stats.rounds > 2


@pytest.mark.parametrize("policy", ["random", "h2o"])
def test_rewind_drops_the_tail_entries_and_its_queries(qwen3_engine, policy):
    session = qwen3_engine.session(config(policy, protect="sink"))
    g = torch.Generator().manual_seed(5)
    session.append(rand_ids(30, g))
    for t in rand_ids(100, g):
        session.step(t)
    before = session.kept_positions()
    assert all(int(p.max()) >= 118 for p in before)
    session.rewind(12)  # fewer than the window (16): its oldest 4 queries stay
    for old, new in zip(before, session.kept_positions(), strict=True):
        real = new[new >= 0]
        assert int(real.max()) < 118  # no head keeps a rewound position
        # every entry of a kept position is still there (entries evicted before stay evicted)
        assert int((old[(old >= 0) & (old < 118)]).numel()) == int(real.numel())
    cache = session.cache
    for li in range(qwen3_engine.n_layers):
        assert int(cache.window_positions[li].max()) == 117  # the queries of rewound tokens went too
        for p in cache.pending_positions[li]:
            assert int(p.max()) < 118


@pytest.mark.parametrize("budget", [64, 0.5])
def test_a_round_due_right_after_rewinding_the_whole_window_still_has_queries(qwen3_engine, budget):
    """Scope prefill lets a reply overflow K + r (and a fractional K shrinks with a rewind), so a
    round is due before the next forward; the rewind took back every recorded query, so one token
    is fed first and the round scores with its query."""
    session = qwen3_engine.session(config("snapkv", scope="prefill", budget=budget, protect="sink"))
    g = torch.Generator().manual_seed(8)
    with trace(session) as records:
        session.append(rand_ids(70, g))
        for t in rand_ids(90, g):
            session.step(t)
        rounds = session.stats.rounds
        session.rewind(40)
        assert session.cache.window_positions[0] is None
        session.append(rand_ids(30, g), all_logits=True)
    assert session.stats.rounds > rounds
    assert [len(r.ids) for r in records if r.start == 120] == [1]  # the token fed before the round
    assert check_session_against_oracle(session, records) < TOL


def test_reprefill_rewind_under_eviction_equals_a_fresh_session(qwen3_engine):
    cfg = config("snapkv", mode="reprefill")
    session = qwen3_engine.session(cfg)
    g = torch.Generator().manual_seed(6)
    prompt, reply, obs = rand_ids(20, g), rand_ids(40, g), rand_ids(60, g)
    session.append(prompt)
    for t in reply:
        session.step(t)
    session.append(obs)
    session.rewind(70)
    tail = rand_ids(45, g)
    got = session.append(tail, all_logits=True)
    fresh = qwen3_engine.session(cfg)
    fresh.append(prompt)
    want = fresh.append(reply[:30] + tail, all_logits=True)
    torch.testing.assert_close(got, want[-len(tail) :], atol=TOL, rtol=TOL)
    for a, b in zip(session.kept_positions(), fresh.kept_positions(), strict=True):
        assert torch.equal(a, b)


def test_rewind_refuses_n_outside_the_stream_after_the_prompt(qwen3_engine):
    session = qwen3_engine.session(config("random"))
    with pytest.raises(ConfigError, match=r"rewind: n=1 is outside \[0, 0\]"):
        session.rewind(1)
    session.append(list(range(10)))
    for t in range(5):
        session.step(t)
    for bad in (6, -1):
        with pytest.raises(ConfigError, match=r"rewind: n=-?\d is outside \[0, 5\]; .*first append"):
            session.rewind(bad)
    for bad in ("2", 2.0, True):
        with pytest.raises(ConfigError, match="rewind: n must be an int"):
            session.rewind(bad)
    assert session.logical_length == 15  # nothing changed
    assert session.rewind(0) == 0
    session.generate(1)  # n=0 leaves the last logits
    assert session.rewind(6) == 6 and session.logical_length == 10


@pytest.mark.parametrize("mode", ["persistent", "reprefill"])
def test_after_rewind_generate_and_teacher_force_need_an_append(qwen3_engine, mode):
    session = qwen3_engine.session(config("snapkv", mode=mode))
    session.append(list(range(40)))
    session.append(list(range(40, 50)))
    session.rewind(4)
    for call in (lambda: session.generate(2), lambda: session.teacher_force([1, 2])):
        with pytest.raises(ConfigError, match=r"rewind\(\) took back .*append"):
            call()
    session.append([7, 8])
    assert len(session.generate(2).ids) == 2


def batched_configs() -> list[CacheConfig]:
    """Pooled persistent sessions (rewinding inside their slot), a reprefill one, a fractional
    budget one (private cache) and a dense one."""
    return [
        config("random", seed=0),
        config("random", seed=1, protect="sink"),
        config("h2o", seed=2),
        config("nexus", seed=3),
        config("snapkv", mode="reprefill", seed=4),
        config("random", budget=0.5, seed=5, protect="sink"),
        config("full", seed=6),
    ]


def test_batched_rewinding_sessions_equal_solo_runs(tiny_engines, batch_engines):
    solo_engine, engine = tiny_engines["qwen3"], batch_engines["qwen3"]
    cfgs = batched_configs()
    alone = run_alone(solo_engine, cfgs, episode)
    sessions, results, records = run_together(engine, cfgs, episode)
    assert sessions[0].cache.slot is not None  # the pooled sessions rewound inside their slot
    for i, ((s0, r0), s1, r1) in enumerate(zip(alone, sessions, results, strict=True)):
        assert_same_logits_and_kept(s0, r0, s1, r1, TOL)
        assert s0.history == s1.history == final_stream(i)
        assert s0.stats.rounds == s1.stats.rounds
    for s, rec in zip(sessions, records, strict=True):
        if rec is not None:
            assert check_session_against_oracle(s, rec) < TOL
    assert engine.batcher.rows > engine.batcher.forwards  # forwards were really shared
