"""Session.forget: persistent mode drops exactly the given positions from every (layer, head), so
the logits equal full attention with those (and every evicted) entries masked out; reprefill
mode equals a fresh session fed the history without them; batched equals solo."""

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
    "full": {},
    "random": {},
    "snapkv": {},
    "h2o": {},
    "nexus": {"block": 8},
}


def rand_ids(n: int, g: torch.Generator) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


def config(policy: str, mode: str = "persistent", protect: str = "sink", seed: int = 4, **kw) -> CacheConfig:
    budget = None if policy == "full" else 64
    return CacheConfig(
        policy=policy,
        budget=budget,
        buffer=16,
        protect=protect,
        mode=mode,
        seed=seed,
        policy_args=POLICIES[policy],
        audit=True,
        **kw,
    )


def episode(session, seed: int = 0, forget: bool = True) -> tuple[list[torch.Tensor], list[int]]:
    """prompt, a "thinking" reply, an observation, forget that reply's first half (and, with a
    prompt protected, one prompt token), another reply and observation. Returns the logits of
    every call and the positions forgotten."""
    g = torch.Generator().manual_seed(seed)
    out = [session.append(rand_ids(20, g), all_logits=True)]
    start = session.logical_length
    out += [session.step(t) for t in rand_ids(40, g)]
    out.append(session.append(rand_ids(50, g), all_logits=True))
    dropped = list(range(start, start + 20)) + [3]
    if forget:
        session.forget(dropped)
    out += [session.step(t) for t in rand_ids(30, g)]
    out.append(session.append(rand_ids(45, g), all_logits=True))
    out += [session.step(t) for t in rand_ids(10, g)]
    return out, dropped


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("protect", ["sink", "prompt"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_persistent_forget_matches_masked_full_attention(tiny_engines, kind, policy, protect):
    engine = tiny_engines[kind]
    session = engine.session(config(policy, protect=protect))
    with trace(session) as records:
        logits, dropped = episode(session)
    assert check_session_against_oracle(session, records) < TOL
    assert session.logical_length == len(session.history) == sum(len(r.ids) for r in records)
    for layer in session.kept_positions():
        assert not torch.isin(layer, torch.tensor(dropped)).any()  # gone from every head, protected too
    assert session.stats.forgotten > 0 and session.stats.evicted >= session.stats.forgotten
    assert any(r.forced for r in session.audit)
    if policy != "full":
        assert session.stats.rounds > 2, "the episode must also evict"
    # Forgetting changed what the model reads afterwards.
    plain = engine.session(config(policy, protect=protect))
    other, _ = episode(plain, forget=False)
    assert not torch.allclose(logits[-1], other[-1], atol=1e-3)


def test_forget_right_away_evicts_held_entries_only(qwen3_engine):
    """Per-head keep-sets: heads lose different counts, so the layer goes ragged (PAD entries,
    masked out) until rounds even it out; the return value counts positions still held."""
    session = qwen3_engine.session(config("random"))
    g = torch.Generator().manual_seed(7)
    with trace(session) as records:
        session.append(rand_ids(20, g))
        for t in rand_ids(120, g):
            session.step(t)
        held = {p for layer in session.kept_positions() for p in layer.flatten().tolist()}
        wanted = list(range(30, 90))
        before = session.stats.evicted
        n = session.forget(wanted)
        assert n == len(held & set(wanted)) > 0
        assert session.stats.evicted - before == session.stats.forgotten > 0
        assert any(layer.ragged for layer in session.cache.layers)
        assert all((layer >= 0).sum(-1).min() < layer.shape[-1] for layer in session.kept_positions())
        for t in rand_ids(20, g):
            session.step(t)
    assert check_session_against_oracle(session, records) < TOL


def test_full_policy_forget_shrinks_the_dense_cache(qwen3_engine):
    session = qwen3_engine.session(CacheConfig())
    session.append(list(range(100)))
    assert session.forget(range(10, 40)) == 30
    assert session.stats.entries == [70] * qwen3_engine.n_layers
    assert session.logical_length == 100 and session.history == list(range(100))
    assert not any(layer.ragged for layer in session.cache.layers)  # every head lost the same


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_reprefill_forget_equals_a_fresh_session_without_the_tokens(tiny_engines, kind, policy):
    engine = tiny_engines[kind]
    cfg = config(policy, mode="reprefill", protect="prompt")
    session = engine.session(cfg)
    g = torch.Generator().manual_seed(2)
    prompt = rand_ids(20, g)
    session.append(prompt)
    for t in rand_ids(40, g):
        session.step(t)
    session.append(rand_ids(50, g))
    dropped = [*range(30, 50), 3]
    old = list(session.history)
    assert session.forget(dropped) == 21
    kept = [t for i, t in enumerate(old) if i not in set(dropped)]
    assert session.history == kept and session.prompt_length == 19
    obs = rand_ids(45, g)
    got = session.append(obs, all_logits=True)
    fresh = engine.session(cfg)
    fresh.append(kept[:19])
    want = fresh.append(kept[19:] + obs, all_logits=True)
    torch.testing.assert_close(got, want[-len(obs) :], atol=TOL, rtol=TOL)
    for a, b in zip(session.kept_positions(), fresh.kept_positions(), strict=True):
        assert torch.equal(a, b)
    gen = session.generate(5, sampling=Sampling())
    assert gen.ids == fresh.generate(5, sampling=Sampling()).ids


def test_reprefill_forget_then_step_rebuilds_and_generate_refuses(qwen3_engine):
    cfg = config("snapkv", mode="reprefill")
    session = qwen3_engine.session(cfg)
    session.append(list(range(90)))
    session.forget([5, 6, 7])
    with pytest.raises(ConfigError, match="append first"):
        session.generate(3)
    got = session.step(200)
    fresh = qwen3_engine.session(cfg)
    want = fresh.append([t for t in range(90) if t not in (5, 6, 7)] + [200])
    torch.testing.assert_close(got, want, atol=TOL, rtol=TOL)


def test_forget_rejects_positions_not_fed(qwen3_engine):
    session = qwen3_engine.session(config("random"))
    session.append(list(range(10)))
    assert session.forget([]) == 0
    for bad in ([10], [-1], ["3"], [True]):
        with pytest.raises(ConfigError, match=r"forget: .*\[0, 10\)"):
            session.forget(bad)


def batched_configs() -> list[CacheConfig]:
    """Pooled persistent sessions (forgetting in their slot), a reprefill one, a fractional-budget
    one (private cache) and a dense one."""
    return [
        config("random", seed=0),
        config("random", seed=1),
        config("h2o", seed=2),
        config("snapkv", mode="reprefill", seed=3),
        CacheConfig(policy="random", budget=0.5, buffer=16, protect="sink", seed=4),
        config("full", seed=5),
    ]


def test_batched_forgetting_sessions_equal_solo_runs(tiny_engines, batch_engines):
    solo_engine, engine = tiny_engines["qwen3"], batch_engines["qwen3"]
    cfgs = batched_configs()

    def run(session, i):
        return episode(session, seed=i)[0]

    alone = run_alone(solo_engine, cfgs, run)
    sessions, results, records = run_together(engine, cfgs, run)
    assert sessions[0].cache.slot is not None  # the pooled sessions forgot inside their slot
    for (s0, r0), s1, r1 in zip(alone, sessions, results, strict=True):
        assert_same_logits_and_kept(s0, r0, s1, r1, TOL)
        assert s0.stats.forgotten == s1.stats.forgotten
    for s, rec in zip(sessions, records, strict=True):
        if rec is not None:
            assert check_session_against_oracle(s, rec) < TOL
    assert engine.batcher.rows > engine.batcher.forwards  # forwards were really shared
