"""Reprefill with `Session.reuse_prefix`: each rebuild starts from a copy of the previous rebuild's
dense state at its last whole chunk. The forwards it skips are the ones it copies, chunk for
chunk, so every logit and every keep-set must be bit-identical to rebuilding from position 0."""

from __future__ import annotations

import pytest
import torch

from kvagent.runtime import CacheConfig, Sampling
from kvagent.runtime.policies import available
from tests.runtime.batching import assert_same_logits_and_kept, run_together
from tests.runtime.policies.test_policy_matrix import CASES

VOCAB = 512
CHUNK = 16


def ids(n: int, g: torch.Generator) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


def episode(session, seed: int = 0) -> list[torch.Tensor]:
    """The calls a replay and an agent make: appends with and without every row's logits,
    teacher-forced replies, single steps, a sampled reply; lengths off and on chunk boundaries."""
    g = torch.Generator().manual_seed(seed)
    out = [session.append(ids(40, g), all_logits=True)]
    for turn in range(4):
        out.append(session.teacher_force(ids(9 + 5 * turn, g)))
        out.extend(session.step(t) for t in ids(3, g))
        out.append(
            session.append(ids(CHUNK * 2 if turn == 1 else 23 + 7 * turn, g), all_logits=turn % 2 == 0)
        )
    # Three rebuilds inside one chunk: the first keeps a copy at its start, the others restore it.
    while session.logical_length % CHUNK:
        out.append(session.step(ids(1, g)[0]))
    out.append(session.append(ids(3, g)))
    out.append(session.append(ids(4, g), all_logits=True))
    out.append(session.append(ids(2, g)))
    gen = session.generate(12, sampling=Sampling(temperature=0.8, seed=3))
    out.append(torch.tensor(gen.ids))
    out.append(session.last_logits)
    return out


def config(policy: str, framework: str = "recent-buffer", **kw) -> CacheConfig:
    return CacheConfig(policy=policy, budget=64, buffer=16, protect="sink", mode="reprefill", seed=5,
                       policy_args=CASES[policy], framework=framework, prefill_chunk=CHUNK, **kw)  # fmt: skip


def run(engine, cfg: CacheConfig, reuse: bool, drive=episode):
    s = engine.session(cfg)
    s.reuse_prefix = reuse
    return s, drive(s)


def assert_identical(a, b) -> None:
    (sa, la), (sb, lb) = a, b
    assert len(la) == len(lb)
    for x, y in zip(la, lb, strict=True):
        assert torch.equal(x, y)
    for x, y in zip(sa.kept_positions(), sb.kept_positions(), strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("framework", ["recent-buffer", "topk-all"])
@pytest.mark.parametrize("policy", [p for p in available() if p != "full"])
def test_reuse_is_bit_identical_to_rebuilding_from_zero(tiny_engines, policy, framework):
    engine = tiny_engines["qwen3"]
    off = run(engine, config(policy, framework), reuse=False)
    on = run(engine, config(policy, framework), reuse=True)
    assert_identical(off, on)
    s_off, s_on = off[0].stats, on[0].stats
    assert s_on.reused_tokens > 0 and s_off.reused_tokens == 0
    # What was not run again was restored: the protocol's prefill count is unchanged.
    assert s_on.prefill_tokens + s_on.reused_tokens == s_off.prefill_tokens
    assert s_on.rounds == s_off.rounds and s_on.evicted == s_off.evicted


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_reuse_with_adaptive_heads_and_shared_cadence(tiny_engines, kind):
    engine = tiny_engines[kind]
    for cfg in (config("snapkv", head_budget="adaptive"), config("pyramidkv", cadence="shared")):
        assert_identical(run(engine, cfg, reuse=False), run(engine, cfg, reuse=True))


def test_rewind_and_forget_rebuild_only_from_a_prefix_that_still_holds(tiny_engines):
    """A rewind into the kept prefix, then other tokens: the copy no longer matches the history
    and must not be used; refeeding the same tokens may use it. Forget shifts the history."""
    engine = tiny_engines["qwen3"]

    def drive(s):
        g = torch.Generator().manual_seed(7)
        out = [s.append(ids(40, g))]
        out.append(s.teacher_force(ids(12, g)))
        out.append(s.append(ids(60, g)))  # rebuild of 112: kept state at 112 // 16 * 16 = 112
        s.rewind(50)  # history 62: the copy of 112 tokens holds tokens no longer in it
        out.append(s.append(ids(40, g)))  # other tokens: rebuilt from 0; a copy kept at 96
        before = s.stats.reused_tokens
        replay = s.history[-5:]
        s.rewind(5)
        out.append(s.append(replay))  # the same tokens again: the copy of 96 still matches
        assert (s.stats.reused_tokens > before) == s.reuse_prefix
        again = s.history[-10:]
        s.rewind(10)  # history 92: the copy of 96 holds tokens that are now fed again
        out.append(s.append(again, all_logits=True))  # every row of them must be computed
        s.forget([3, 4, 5])
        out.append(s.append(ids(25, g), all_logits=True))
        out.append(s.teacher_force(ids(5, g)))
        return out

    off = run(engine, config("snapkv"), reuse=False, drive=drive)
    on = run(engine, config("snapkv"), reuse=True, drive=drive)
    assert_identical(off, on)


def test_persistent_sessions_ignore_it(tiny_engines):
    engine = tiny_engines["qwen3"]
    cfg = CacheConfig(policy="h2o", budget=64, buffer=16, protect="sink", prefill_chunk=CHUNK)
    off, on = run(engine, cfg, reuse=False), run(engine, cfg, reuse=True)
    assert_identical(off, on)
    assert on[0].stats.reused_tokens == 0


def test_batched_reuse_equals_solo_rebuilds(batch_engines, tiny_engines):
    cfgs = [config("snapkv"), config("h2o"), config("nexus"), config("random", "topk-all")]
    solo = [
        run(tiny_engines["qwen3"], c, reuse=False, drive=lambda s, i=i: episode(s, i))
        for i, c in enumerate(cfgs)
    ]

    def reusing(s, i):
        s.reuse_prefix = True
        return episode(s, i)

    sessions, results, _ = run_together(batch_engines["qwen3"], cfgs, reusing, traced=False)
    for (s0, l0), s1, l1 in zip(solo, sessions, results, strict=True):
        assert s1.stats.reused_tokens > 0
        # Batched forwards agree with solo ones to a tolerance, not bit for bit, so the sampled
        # reply (the last two entries) could part at a near tie.
        assert_same_logits_and_kept(s0, l0[:-2], s1, l1[:-2], tol=1e-4)


def test_a_copied_session_shares_the_kept_state_and_both_go_on_alike(tiny_engines):
    """The fact probe branches a session with deepcopy: the kept dense state is shared, not copied
    (it is never changed once made), and each copy's later rebuilds still equal a fresh rebuild."""
    import copy

    engine = tiny_engines["qwen3"]
    g = torch.Generator().manual_seed(11)
    a = engine.session(config("h2o"))
    a.reuse_prefix = True
    a.append(ids(40, g))
    a.teacher_force(ids(10, g))
    a.append(ids(30, g))
    b = copy.deepcopy(a, {id(engine): engine})
    more = [ids(20, g), ids(25, g)]
    out = []
    for s in (a, b):
        out.append([s.append(more[0]), s.teacher_force(more[1][:5]), s.append(more[1])])
        assert s.stats.reused_tokens > 0
    for x, y in zip(*out, strict=True):
        assert torch.equal(x, y)
