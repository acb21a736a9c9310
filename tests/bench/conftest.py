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


@pytest.fixture
def study_cli(monkeypatch):
    """The pieces every `bench study` resume test shares: `args(claim, episodes, out)` (the command
    line on the tiny model), `stop_after(n)` (replays run n runs, then Ctrl-C) and `count()` (replays
    run normally); both record each run's name in the list they return."""
    from types import SimpleNamespace

    from kvagent.bench import replay

    real = replay.policy_run

    def args(claim, episodes, out):
        return ["bench", "study", "--claim", claim, "--model", "tiny-random-qwen3", "--device", "cpu",
                "--episodes", str(episodes), "--out", str(out), "--quiet"]  # fmt: skip

    def stop_after(n):
        calls = []

        def stopping(*a, **k):
            calls.append(a[1].name)
            if len(calls) > n:
                raise KeyboardInterrupt
            return real(*a, **k)

        monkeypatch.setattr(replay, "policy_run", stopping)
        return calls

    def count():
        calls = []
        monkeypatch.setattr(replay, "policy_run", lambda *a, **k: calls.append(a[1].name) or real(*a, **k))
        return calls

    return SimpleNamespace(args=args, stop_after=stop_after, count=count)
