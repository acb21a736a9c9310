import os

import pytest


def pytest_configure(config):
    # Small models on a 2-core machine: more threads than cores only adds contention.
    import torch

    torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    from kvagent.runtime.models import load_qwen3_tokenizer

    return load_qwen3_tokenizer()
