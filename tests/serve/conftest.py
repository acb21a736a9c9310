"""A real uvicorn on 127.0.0.1 (a free port) serving the tiny random Qwen3 in this process, an
`openai` client for it, its /metrics parsed, and the library's side of a served conversation
(the same token stream through one Session) to compare replies with."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

MODEL = "tiny"


def prompt_of(tokenizer, messages: list[dict[str, Any]], **kw: Any) -> list[int]:
    """The token ids a chat renders to, as a client's messages reach the model."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kw)
    return tokenizer.encode(text, add_special_tokens=False)


def head_of(tokenizer, messages: list[dict[str, Any]], **kw: Any) -> int:
    """Tokens of the chat before its generation prompt: a new session's first append."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=False, **kw)
    return len(tokenizer.encode(text, add_special_tokens=False))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class Replay:
    """One conversation through the library: the first prompt appended (the chat up to its
    generation prompt first, then the rest), each later prompt's new tokens appended after taking
    back what the prompt does not share with the stream (the last prompt token is fed again when
    the prompt is all shared), each reply by Session.generate."""

    def __init__(self, engine, config) -> None:
        self.session = engine.session(config)

    def turn(self, prompt: list[int], max_tokens: int, sampling=None, first: int | None = None, **options):
        """`options`: Session.generate's keyword options (seed, stopping)."""
        from kvagent.runtime import Sampling

        s = self.session
        if not s.history:
            keep = 0
            if first is not None and first < len(prompt):
                s.append(prompt[:first])
                s.append(prompt[first:])
            else:
                s.append(prompt)
        else:
            keep = min(common_prefix(prompt, s.history), len(prompt) - 1)
            s.rewind(s.logical_length - keep)
            s.append(prompt[keep:])
        return s.generate(max_tokens, sampling=sampling or Sampling(temperature=0.0), **options), keep


class Served:
    """`kvagent.serve`'s app on uvicorn in a thread; stopped by `close` (the fixture does it)."""

    def __init__(self, engine, **config: Any) -> None:
        import openai
        import uvicorn

        from kvagent.serve import ServeConfig, create_app

        self.engine = engine
        self.app = create_app(engine, ServeConfig(model_name=MODEL, **config))
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, log_level="warning", timeout_graceful_shutdown=5)
        )
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)
        self.client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=300)

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics: `name{label="v",...}` (labels sorted) -> value."""
        import httpx
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "uvicorn did not stop"


@pytest.fixture(scope="session")
def tiny_model(qwen3_tokenizer):
    from kvagent.runtime.models import tiny_random_model

    return tiny_random_model("qwen3", vocab_size=len(qwen3_tokenizer))


@pytest.fixture(scope="session")
def solo_engine(tiny_model, qwen3_tokenizer):
    from kvagent.runtime import Engine

    return Engine.load(tiny_model, tokenizer=qwen3_tokenizer, device="cpu")


@pytest.fixture
def batch_engine(tiny_model, qwen3_tokenizer):
    """A batching engine of its own (its batcher's counters start at zero)."""
    from kvagent.runtime import Engine

    engine = Engine.load(tiny_model, tokenizer=qwen3_tokenizer, device="cpu", max_batch=8)
    yield engine
    engine.close()


@pytest.fixture
def serve():
    """serve(engine, **ServeConfig fields) -> a running Served; every one is stopped at test end."""
    started: list[Served] = []

    def start(engine, **config: Any) -> Served:
        started.append(Served(engine, **config))
        return started[-1]

    yield start
    for s in started:
        s.close()
