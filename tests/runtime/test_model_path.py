"""The one model path (decoder.py's `Decoder.forward`): every forward of a Llama-family engine,
eager or static, runs the decoder; transformers' modules run only for other architectures. The two
compute the same episode (logits within float32 rounding, the same entries kept), and an
architecture without a decoder still passes the oracle through the modules."""

from __future__ import annotations

import copy

import pytest
import torch

from kvagent.runtime import CacheConfig, Engine
from kvagent.runtime.oracle import check_session_against_oracle, random_episode, trace


def _episode(engine, config: CacheConfig, seed: int = 4):
    s = engine.session(config)
    gen = torch.Generator().manual_seed(seed)
    out = [s.append(torch.randint(1, 500, (48,), generator=gen).tolist(), all_logits=True)]
    for turn in range(3):
        for _ in range(20):
            out.append(s.step(int(torch.randint(1, 500, (1,), generator=gen))))
        out.append(s.append(torch.randint(1, 500, (17 + 9 * turn,), generator=gen).tolist(), all_logits=True))
    return s, out


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("policy", ["full", "snapkv", "h2o"])
def test_the_decoder_and_the_modules_compute_the_same_episode(tiny_engines, kind, policy):
    """h2o reads every query's attention mass and snapkv the window's: both come through the same
    PackedCache calls on either path, so the same entries survive every round."""
    base = tiny_engines[kind]
    engine = Engine.load(
        copy.deepcopy(base.model), tokenizer=base.tokenizer, device="cpu", decode_step="eager"
    )
    assert engine.model_path is not None
    budget = None if policy == "full" else 32
    config = CacheConfig(policy=policy, budget=budget, buffer=8, protect="sink")
    with_decoder, logits_decoder = _episode(engine, config)
    engine.model_path = None  # transformers' modules, through the attention hook
    with_modules, logits_modules = _episode(engine, config)
    if policy != "full":
        assert with_decoder.stats.rounds > 3
    assert with_decoder.stats.rounds == with_modules.stats.rounds
    for a, b in zip(logits_modules, logits_decoder, strict=True):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
    for a, b in zip(with_modules.kept_positions(), with_decoder.kept_positions(), strict=True):
        assert torch.equal(a, b)


def test_a_wrong_decoder_is_caught(tiny_engines):
    """The comparison above can fail: a decoder whose first layer's MLP is off by a little."""
    base = tiny_engines["qwen3"]
    engine = Engine.load(
        copy.deepcopy(base.model), tokenizer=base.tokenizer, device="cpu", decode_step="eager"
    )
    config = CacheConfig(policy="full")
    _, good = _episode(engine, config)
    engine.model_path.layers[0].down = engine.model_path.layers[0].down * 1.01
    _, bad = _episode(engine, config)
    assert max(float((a - b).abs().max()) for a, b in zip(good, bad, strict=True)) > 1e-3


def test_an_architecture_without_a_decoder_runs_the_modules_and_passes_the_oracle(qwen3_tokenizer):
    """Gemma (scaled embeddings, 1 + w norms): not the Llama family, so no decoder; its forwards run
    transformers' modules, say why (`mode`), and eviction still matches masked full attention."""
    from transformers import AutoModelForCausalLM, GemmaConfig

    config = GemmaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=4096, eos_token_id=1, pad_token_id=0, bos_token_id=2)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    engine = Engine.load(model, tokenizer=qwen3_tokenizer, device="cpu")
    assert engine.decoder is None and engine.model_path is None
    session = engine.session(CacheConfig(policy="random", budget=40, buffer=16, protect="sink", seed=3))
    with trace(session) as records:
        random_episode(session, vocab=512, turns=3)
    assert session.stats.rounds > 2
    assert set(session.stats.forwards) == {"mode"}
    assert check_session_against_oracle(session, records) < 1e-4
