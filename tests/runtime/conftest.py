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


@pytest.fixture(scope="module")
def batch_engines(tiny_engines):
    """The tiny models again on engines that batch concurrent sessions (max_batch 8), fresh per module
    so that batcher counters start at zero there."""
    engines = {
        kind: Engine.load(e.model, tokenizer=e.tokenizer, device="cpu", max_batch=8)
        for kind, e in tiny_engines.items()
    }
    yield engines
    for e in engines.values():
        e.close()
