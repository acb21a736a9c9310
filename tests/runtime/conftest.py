import pytest

from kvagent.runtime import Engine
from kvagent.runtime.models import tiny_random_model


@pytest.fixture(scope="session")
def tiny_engines(qwen3_tokenizer):
    """Tiny GQA Qwen3 and Llama (vocab 512 keeps full-sequence logits small)."""
    return {
        kind: Engine.load(
            tiny_random_model(kind, vocab_size=512, seed=1), tokenizer=qwen3_tokenizer, device="cpu"
        )
        for kind in ("qwen3", "llama")
    }


@pytest.fixture(scope="session")
def qwen3_engine(tiny_engines):
    return tiny_engines["qwen3"]
