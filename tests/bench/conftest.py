import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvagent.runtime import Engine


@pytest.fixture(scope="session")
def tiny_engine():
    # The real Qwen3 tokenizer with a random 2-layer model: stream ids need the full vocabulary.
    return Engine.load("tiny-random-qwen3", device="cpu")


@pytest.fixture
def together():
    """`together(fn)`: fn's results from two threads released at once, as two processes started on
    one out dir (flock locks open files, so two opens in one process exclude each other as two
    processes do). The first error is raised."""

    def run(fn, n: int = 2) -> list:
        start = threading.Barrier(n)

        def worker():
            start.wait()
            return fn()

        with ThreadPoolExecutor(max_workers=n) as pool:
            futures = [pool.submit(worker) for _ in range(n)]
        return [f.result() for f in futures]

    return run
