"""Session behaviour: generation, chunking, modes, memory bound, positions, errors, stats."""

import copy

import pytest
import torch

from kvagent.errors import ConfigError
from kvagent.runtime import CacheConfig, Engine, Sampling
from kvagent.runtime.models import tiny_random_model
from kvagent.runtime.oracle import trace
from kvagent.runtime.policies import BasePolicy, register


def rand_ids(n, seed):
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_full_generate_matches_hf_generate(qwen3_tokenizer):
    model = tiny_random_model("qwen3", vocab_size=512, seed=5)
    reference = copy.deepcopy(model)  # stock sdpa attention, DynamicCache
    engine = Engine.load(model, tokenizer=qwen3_tokenizer, device="cpu")
    prompt = rand_ids(17, 0)
    session = engine.session(CacheConfig())
    session.append(prompt)
    got = session.generate(24, sampling=Sampling()).ids
    with torch.no_grad():
        out = reference.generate(
            torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    assert got == out[0, len(prompt) :].tolist()


def test_chunk_on_compacted_cache_equals_token_by_token(qwen3_engine):
    cfg = CacheConfig(policy="random", budget=32, buffer=64, protect="sink", seed=1)
    a, b = qwen3_engine.session(cfg), qwen3_engine.session(cfg)
    kept = 32 + cfg.recent_buffer  # what a round leaves: K and the recent buffer (recent-buffer framework)
    history = rand_ids(kept + 64, 1)  # K + 2r: exactly one round at the end
    a.append(history)
    b.append(history)
    assert a.stats.rounds == 1 and a.stats.entries[0] == kept
    chunk = rand_ids(20, 2)  # kept + 20 < K + 2r: no round inside the chunk
    chunk_logits = a.append(chunk, all_logits=True)
    step_logits = torch.stack([b.step(t) for t in chunk])
    assert a.stats.rounds == b.stats.rounds == 1
    torch.testing.assert_close(chunk_logits, step_logits, atol=1e-4, rtol=1e-4)


def test_reprefill_cache_depends_only_on_history_and_window(qwen3_engine):
    cfg = CacheConfig(policy="random", budget=40, buffer=8, protect="sink", mode="reprefill", seed=2)
    a_part, s_part, b_part = rand_ids(60, 3), rand_ids(25, 4), rand_ids(30, 5)
    one = qwen3_engine.session(cfg)
    one.append(a_part)
    for t in s_part:
        one.step(t)
    one.append(b_part)
    two = qwen3_engine.session(cfg)
    two.append(a_part + s_part)  # different path, same history, same last turn
    two.append(b_part)
    assert one.history == two.history
    for x, y in zip(one.kept_positions(), two.kept_positions(), strict=True):
        assert torch.equal(x, y)
    # persistent mode with the same config and path keeps a different set (history-dependent)
    p1 = qwen3_engine.session(CacheConfig(**{**cfg.to_dict(), "mode": "persistent"}))
    p1.append(a_part)
    for t in s_part:
        p1.step(t)
    p1.append(b_part)
    assert any(not torch.equal(x, y) for x, y in zip(one.kept_positions(), p1.kept_positions(), strict=True))


def kept_sets(session):
    return [[set(h.tolist()) for h in layer[0]] for layer in session.kept_positions()]


def test_persistent_never_readmits_but_reprefill_does(qwen3_engine):
    def evicted_then_back(mode):
        cfg = CacheConfig(policy="random", budget=40, buffer=8, protect="sink", mode=mode, seed=4)
        s = qwen3_engine.session(cfg)
        s.append(rand_ids(50, 6))
        gone = [[set() for _ in range(2)] for _ in range(2)]
        readmitted = 0
        for turn in range(6):
            for t in rand_ids(10, 100 + turn):
                s.step(t)
            s.append(rand_ids(20, 200 + turn))
            for li, layer in enumerate(kept_sets(s)):
                for h, kept in enumerate(layer):
                    readmitted += len(kept & gone[li][h])
                    seen = set(range(s.logical_length))
                    gone[li][h] |= seen - kept
        return readmitted

    assert evicted_then_back("persistent") == 0
    assert evicted_then_back("reprefill") > 0


@pytest.mark.parametrize("scope", ["prefill+decode", "prefill"])
def test_kv_bytes_bounded_by_budget_plus_buffer(qwen3_engine, scope):
    k, r = 48, 16
    s = qwen3_engine.session(CacheConfig(policy="random", budget=k, buffer=r, scope=scope, protect="sink"))
    k += s.config.recent_buffer  # the recent buffer (recent-buffer framework) is held beside K: peak K + 2r
    e = qwen3_engine
    per_entry = e.n_kv_heads * (2 * e.head_dim * 4 + 8)  # keys + values float32, int64 position
    s.append(rand_ids(300, 7))
    for turn in range(5):
        s.append(rand_ids(200, 8 + turn))
        assert max(s.stats.kv_bytes) <= (k + r) * per_entry
        decoded = 30 if scope == "prefill" else 100
        before, rounds = max(s.stats.entries), s.stats.rounds
        for t in rand_ids(decoded, 20 + turn):
            s.step(t)
            if scope == "prefill+decode":
                assert max(s.stats.entries) <= k + r
        if scope == "prefill":  # decode never evicts in this scope: it grows by what it decoded
            assert s.stats.rounds == rounds and max(s.stats.entries) == before + decoded > k + r
    assert s.logical_length > 1000


def test_positions_continue_from_episode_length(qwen3_engine):
    s = qwen3_engine.session(CacheConfig(policy="random", budget=32, buffer=8, protect="sink"))
    s.append(rand_ids(200, 9))
    with trace(s) as records:
        s.step(5)
    assert s.stats.entries[0] < 200
    assert [(r.start, r.ids) for r in records] == [(200, [5])]
    assert s.cache.current_positions.tolist() == [200]
    assert all(int(p.max()) == 200 for p in s.kept_positions())


def test_generate_stops_on_stop_string_and_eos(qwen3_engine):
    s = qwen3_engine.session(CacheConfig())
    s.append(rand_ids(10, 10))
    g = s.generate(8)
    assert g.finish_reason == "length" and len(g.ids) == 8
    assert s.logical_length == 18  # every sampled id is fed
    text = qwen3_engine.tokenizer.decode(g.ids[:3]).rstrip("\ufffd")  # whole characters
    s2 = qwen3_engine.session(CacheConfig())
    s2.append(rand_ids(10, 10))
    g2 = s2.generate(8, stop=[text[-2:]])
    assert g2.finish_reason == "stop" and len(g2.ids) <= 3
    eos_token = g.ids[2]
    qwen3_engine.eos_token_ids.add(eos_token)
    try:
        s3 = qwen3_engine.session(CacheConfig())
        s3.append(rand_ids(10, 10))
        g3 = s3.generate(8)
    finally:
        qwen3_engine.eos_token_ids.discard(eos_token)
    assert g3.finish_reason == "eos" and g3.ids[-1] == eos_token


def test_sampling_is_seeded(qwen3_engine):
    def draw(seed):
        s = qwen3_engine.session(CacheConfig())
        s.append(rand_ids(10, 11))
        return s.generate(12, sampling=Sampling(temperature=1.0, top_p=0.9, top_k=50, seed=seed)).ids

    assert draw(1) == draw(1)
    assert draw(1) != draw(2)


class _BlockTestPolicy(BasePolicy):
    name = "_test_block32"
    shared_across_heads = True
    block = 32

    def scores(self, view):
        return view.positions[:, :1].float()


@pytest.fixture
def block_test_policy():
    # Registered only for the test that needs it: tests that enumerate the registry (the oracle
    # matrix, batched-equals-solo) must see the built-in policies alone.
    from kvagent.runtime.policies import base

    register(_BlockTestPolicy)
    yield _BlockTestPolicy.name
    base._REGISTRY.pop(_BlockTestPolicy.name, None)


def test_config_errors_are_one_line_and_name_the_field(qwen3_engine, block_test_policy):
    with pytest.raises(ConfigError, match="^policy: unknown policy 'nope'"):
        CacheConfig(policy="nope")
    with pytest.raises(ConfigError, match="^budget: 100 is not a multiple of _test_block32's block 32"):
        qwen3_engine.session(CacheConfig(policy="_test_block32", budget=100))
    with pytest.raises(ConfigError, match="^budget: .* exceeds the model's context limit"):
        qwen3_engine.session(CacheConfig(policy="random", budget=10**6))
    s = qwen3_engine.session(CacheConfig(policy="random", budget=16, protect="prompt"))
    with pytest.raises(ConfigError, match="^budget: K=16 .* protects all 20 prompt tokens"):
        s.append(rand_ids(20, 12))
    for bad in (dict(budget=-3), dict(budget=1.5), dict(protect="all"), dict(mode="x"), dict(scope="decode")):
        with pytest.raises(ConfigError) as err:
            CacheConfig(policy="random", **bad)
        assert "\n" not in str(err.value) and str(err.value).split(":")[0] in bad


def test_block_policy_keeps_whole_blocks_shared_across_heads(qwen3_engine, block_test_policy):
    s = qwen3_engine.session(CacheConfig(policy="_test_block32", budget=64, buffer=32, protect="sink"))
    s.append(rand_ids(200, 13))
    for layer in s.kept_positions():
        assert torch.equal(layer[0, 0], layer[0, 1])
        assert layer.shape[-1] <= 64 + 32


def test_stats_and_audit(qwen3_engine):
    s = qwen3_engine.session(CacheConfig(policy="random", budget=32, buffer=8, protect="prompt", audit=True))
    s.append(rand_ids(12, 14))
    s.append(rand_ids(100, 15))
    st = s.stats
    assert st.rounds >= 8 and st.evicted > 0 and st.scoring_s > 0 and st.compaction_s > 0
    assert st.prefill_tokens == 112 and st.logical_length == 112
    assert len(s.audit) == st.rounds * qwen3_engine.n_layers
    last = s.audit[-1]
    assert last.kept.shape == (2, 32 + 8) and last.prompt_length == 12  # K and the recent buffer
    assert set(range(12)) <= set(last.kept[0].tolist())  # the protected prompt survives every round


@pytest.mark.parametrize("mode", ["persistent", "reprefill"])
@pytest.mark.parametrize("scope", ["prefill+decode", "prefill"])
def test_teacher_force_equals_stepping(qwen3_engine, mode, scope):
    cfg = CacheConfig(policy="random", budget=40, buffer=16, protect="sink", mode=mode, scope=scope, seed=6)
    a, b = qwen3_engine.session(cfg), qwen3_engine.session(cfg)
    prompt, reply = rand_ids(70, 16), rand_ids(90, 17)
    a.append(prompt)
    b.append(prompt)
    stepped = torch.stack([a.step(t) for t in reply])
    forced = b.teacher_force(reply)
    torch.testing.assert_close(forced, stepped, atol=1e-4, rtol=1e-4)
    assert a.stats.rounds == b.stats.rounds and (a.stats.rounds > 1) == (scope == "prefill+decode")
    assert a.stats.decode_tokens == b.stats.decode_tokens == 90
    for x, y in zip(a.kept_positions(), b.kept_positions(), strict=True):
        assert torch.equal(x, y)
