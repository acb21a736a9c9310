"""Streaming: the SSE chunks of a reply add up to the non-streamed reply (same seed, sampled), on
both endpoints; a client that leaves mid-stream stops its generation and frees its session."""

from __future__ import annotations

import time

import httpx

from .conftest import MODEL

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Write a haiku about caches."},
]
# (top_p is left at 1: the runtime's sort over a 151k vocabulary costs ~0.1 s a token on 2 CPU cores)
SAMPLED = dict(temperature=0.9, seed=1234, extra_body={"top_k": 200, "min_tokens": 12})


def test_chat_stream_concatenates_to_the_non_streamed_reply(serve, solo_engine):
    srv = serve(solo_engine)
    whole = srv.client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, **SAMPLED)
    stream = srv.client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
        **SAMPLED,
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(deltas) > 3, "the reply came in one piece, not streamed"
    assert "".join(deltas) == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    usage = chunks[-1].usage.model_dump()
    assert not chunks[-1].choices and usage["completion_tokens"] == whole.usage.completion_tokens >= 12
    # another seed samples another reply (the seed is the request's, not the session's)
    other = srv.client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=24, **{**SAMPLED, "seed": 99}
    )
    assert other.choices[0].message.content != whole.choices[0].message.content


def test_completions_stream_concatenates_and_stop_strings_cut(serve, solo_engine):
    srv = serve(solo_engine)
    kw = dict(model=MODEL, prompt="def add(a, b):\n", max_tokens=30, temperature=0)
    whole = srv.client.completions.create(**kw)
    text = whole.choices[0].text
    parts = [c.choices[0].text for c in srv.client.completions.create(**kw, stream=True) if c.choices]
    assert "".join(parts) == text and len([p for p in parts if p]) > 3
    # a stop string from the middle of that reply ends the next one just before it
    stop = text[10:13]
    cut = srv.client.completions.create(**kw, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(stop)]
    parts = [
        c.choices[0].text for c in srv.client.completions.create(**kw, stop=[stop], stream=True) if c.choices
    ]
    assert "".join(parts) == cut.choices[0].text


def test_token_id_prompts_and_ignore_eos(serve, solo_engine):
    srv = serve(solo_engine)
    ids = solo_engine.encode("print('hello')")
    r = srv.client.completions.create(
        model=MODEL, prompt=ids, max_tokens=25, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == 25 and r.choices[0].finish_reason == "length"


def test_client_disconnect_stops_generation(serve, solo_engine):
    srv = serve(solo_engine)
    # 60,000 tokens take minutes on any CPU: a generation that went on after the client left would
    # still be running at the deadline below.
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 60_000, "stream": True, "ignore_eos": True}
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", f"{srv.url}/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [line for _, line in zip(range(6), lines, strict=False)]
        assert any(line.startswith("data: ") for line in got)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = srv.metrics()
        if m["kvagent_client_disconnects_total"] >= 1 and m["kvagent_requests_running"] == 0:
            break
        time.sleep(0.2)
    assert m["kvagent_client_disconnects_total"] == 1 and m["kvagent_requests_running"] == 0
    assert m["kvagent_busy_sessions"] == 0
    # the server goes on serving
    r2 = srv.client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3, temperature=0)
    assert r2.choices[0].finish_reason == "length"
