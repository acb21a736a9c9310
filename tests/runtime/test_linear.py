"""CPU matmuls over oneDNN-packed weights (runtime/linear.py): the same numbers as F.linear within
float32 rounding, rows independent of their batch, every nn.Linear and the static step on them, and
the modes checked."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

from kvagent.errors import ConfigError
from kvagent.runtime import CacheConfig, Engine, linear

PACKED_OP = "mkldnn::_linear_pointwise"


def test_packed_linear_equals_f_linear_and_rows_do_not_depend_on_the_batch():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 40, generator=gen) * 0.1
    bias = torch.randn(96, generator=gen)
    x = torch.randn(70, 40, generator=gen)
    packed = linear.pack(w)
    full = linear.linear(x, packed, bias)
    torch.testing.assert_close(full, F.linear(x, w, bias), atol=1e-6, rtol=1e-5)
    for m in (1, 2, 3, 8, 13, 64):  # decode batches and a prefill chunk's rows
        assert torch.equal(linear.linear(x[:m], packed, bias), full[:m])
    three_d = linear.linear(x[:60].view(3, 20, 40), packed, bias)  # (batch, tokens, features)
    assert torch.equal(three_d.reshape(60, 96), full[:60])


def _script(engine, seed: int = 2) -> list[torch.Tensor]:
    s = engine.session(CacheConfig(policy="random", budget=24, buffer=8, protect="sink"))
    gen = torch.Generator().manual_seed(seed)
    out = [s.append(torch.randint(1, 500, (40,), generator=gen).tolist())]
    for _ in range(60):
        out.append(s.step(int(torch.randint(1, 500, (1,), generator=gen))))
    out.append(s.append(torch.randint(1, 500, (25,), generator=gen).tolist()))
    assert s.stats.rounds > 2
    return out


def _load(base, **kwargs):
    return Engine.load(copy.deepcopy(base.model), tokenizer=base.tokenizer, device="cpu", **kwargs)


def test_a_packed_engine_computes_as_a_plain_one_through_the_packed_op(tiny_engines):
    """Packed: prefill, eager and static decode all run the packed op (and a plain engine never
    does), with the plain engine's logits within float32 rounding. Every forward is the decoder's
    (the one model path): four fused matmuls a layer and the head, eager or static."""
    base = tiny_engines["qwen3"]
    runs = {}
    for name, kwargs in {
        "plain": dict(linear="plain"),
        "packed": dict(linear="packed"),  # every weight: auto leaves a tiny model's plain
        "packed-eager": dict(decode_step="eager", linear="packed"),
    }.items():
        engine = _load(base, **kwargs)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            runs[name] = _script(engine)
        runs[name + ":ops"] = {e.key: e.count for e in prof.key_averages()}
        runs[name + ":steps"] = engine.step_runner.steps
    assert PACKED_OP not in runs["plain:ops"] and runs["plain:ops"]["aten::mm"] > 0
    assert runs["packed:steps"] >= 60 and runs["packed-eager:steps"] == 0
    n_step = 4 * base.n_layers + 1  # the decoder's: q/k/v, o, gate/up, down per layer, the head
    for name, least in (("packed", 62 * n_step), ("packed-eager", 62 * n_step)):
        ops = runs[name + ":ops"]
        assert ops[PACKED_OP] >= least  # every matmul of every forward
        assert "aten::mm" not in ops and "aten::addmm" not in ops
        for a, b in zip(runs["plain"], runs[name], strict=True):
            torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


def test_auto_packs_the_weights_big_enough_to_pay(qwen3_tokenizer):
    """auto: float32 weights of MIN_ELEMENTS or more (a 512-wide model's q/o/MLP/head), not the
    small k/v projections. An engine packs its model path's weights (the decoder's fused q/k/v and
    gate/up, o, down, the head) and leaves the modules plain (they run only for architectures
    without a decoder, which `install` packs: the same threshold)."""
    from kvagent.runtime.models import tiny_random_model

    model = tiny_random_model("qwen3", vocab_size=512, hidden_size=512, intermediate_size=1024, head_dim=64,
                              num_attention_heads=8, num_key_value_heads=2)  # fmt: skip
    engine = Engine.load(model, tokenizer=qwen3_tokenizer, device="cpu")
    assert not any("forward" in m.__dict__ for m in model.modules())  # the modules stay plain
    layer = engine.model_path.layers[0]
    assert engine.step_runner.decoder is engine.model_path
    assert layer.qkv.is_mkldnn and layer.gate_up.is_mkldnn and layer.down.is_mkldnn and layer.o.is_mkldnn
    assert engine.model_path.lm_head.is_mkldnn and not engine.decoder.layers[0].qkv.is_mkldnn
    linear.install(model, engine.packs)  # the fallback's modules, as for an architecture without one
    packed = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if "forward" in m.__dict__}
    assert packed == {"q_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"}
    assert model.model.layers[0].self_attn.k_proj.weight.numel() < linear.MIN_ELEMENTS


def test_packs_leave_small_weights_plain():
    packs = linear.Packs(min_elements=100)
    small, big = torch.randn(9, 11), torch.randn(10, 10)
    assert packs(small) is small and packs(big).is_mkldnn
    x = torch.randn(4, 10)
    torch.testing.assert_close(linear.linear(x, packs(big)), F.linear(x, big), atol=1e-6, rtol=1e-5)
    y = torch.randn(2, 11)
    assert torch.equal(linear.linear(y, small), F.linear(y, small))  # a plain weight: F.linear itself


def test_a_compiled_engine_stays_plain_unless_asked(tiny_engines):
    base = tiny_engines["qwen3"]
    assert _load(base, decode_step="compiled").packs is None  # compiled cannot trace a packed weight
    assert _load(base, decode_step="compiled", linear="packed").packs is not None
    # auto packs bfloat16 only where the CPU has bf16 units (measured there: docs/benchmarks.md)
    assert (_load(base, dtype="bfloat16").packs is not None) == linear.bf16_units()


def test_install_undoes_itself_and_a_deep_copy_repacks(tiny_engines):
    base = tiny_engines["llama"]
    model = copy.deepcopy(base.model)
    packs = linear.Packs()  # every weight, however small
    n = linear.install(model, packs)
    assert n == sum(type(m) is nn.Linear for m in model.modules()) > 0
    x = torch.randn(3, model.config.hidden_size)
    proj = model.model.layers[0].self_attn.q_proj
    packed_out = proj(x)
    twin = copy.deepcopy(model)  # an opaque tensor cannot be copied: the copy packs its own
    assert torch.equal(twin.model.layers[0].self_attn.q_proj(x), packed_out)
    assert packs(proj.weight) is packs(proj.weight)  # one packing per plain weight
    linear.install(model, None)
    assert "forward" not in proj.__dict__
    torch.testing.assert_close(proj(x), packed_out, atol=1e-6, rtol=1e-5)


def test_linear_modes_are_checked():
    cpu, f32 = torch.device("cpu"), torch.float32
    with pytest.raises(ConfigError, match="linear: got 'fast'; choose auto, packed, plain"):
        linear.resolve("fast", cpu, f32)
    with pytest.raises(ConfigError, match="not for cuda"):
        linear.resolve("packed", torch.device("cuda"), f32)
    with pytest.raises(ConfigError, match="float32 or bfloat16, not torch.float16"):
        linear.resolve("packed", cpu, torch.float16)
    assert linear.resolve("auto", cpu, f32) and not linear.resolve("plain", cpu, f32)
    assert not linear.resolve("auto", torch.device("cuda"), f32)


def test_auto_packs_bfloat16_only_on_a_cpu_with_bf16_units(monkeypatch):
    cpu, bf16 = torch.device("cpu"), torch.bfloat16
    monkeypatch.setattr(linear, "bf16_units", lambda: False)
    assert linear.resolve("auto", cpu, bf16) is None
    monkeypatch.setattr(linear, "bf16_units", lambda: True)
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():  # oneDNN cannot pack bf16 here: auto stays plain
        assert linear.resolve("auto", cpu, bf16) is None
        return
    assert linear.resolve("auto", cpu, bf16) is not None
    assert linear.resolve("auto", cpu, bf16, decode_step="compiled") is None
    assert linear.resolve("auto", cpu, torch.float16) is None
