import pytest

from kvagent.runtime import Engine


@pytest.fixture(scope="session")
def tiny_engine():
    # The real Qwen3 tokenizer with a random 2-layer model: stream ids need the full vocabulary.
    return Engine.load("tiny-random-qwen3", device="cpu")
