"""Malformed requests: each gets a 4xx JSON error whose message is one line naming the field, never
a 500, and the server keeps serving."""

from __future__ import annotations

import json

import httpx
import pytest

from .conftest import MODEL

CHAT = "/v1/chat/completions"
DONE = "/v1/completions"
OK_MESSAGES = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return json.dumps({"model": MODEL, "messages": OK_MESSAGES, "max_tokens": 4, **fields})


def completion(**fields):
    return json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 4, **fields})


# (name, method, path, body, status, a word the message must hold)
CASES = [
    ("bad json", "POST", CHAT, "{bad", 400, "JSON"),
    ("empty body", "POST", CHAT, "", 400, "empty"),
    ("body not an object", "POST", CHAT, "[1, 2]", 400, "object"),
    ("missing model", "POST", CHAT, json.dumps({"messages": OK_MESSAGES}), 400, "model"),
    ("model not a string", "POST", CHAT, chat(model=7), 400, "model"),
    ("unknown model", "POST", CHAT, chat(model="gpt-4"), 400, "gpt-4"),
    ("missing messages", "POST", CHAT, json.dumps({"model": MODEL}), 400, "messages"),
    ("messages not a list", "POST", CHAT, chat(messages="hi"), 400, "messages"),
    ("empty messages", "POST", CHAT, chat(messages=[]), 400, "empty"),
    ("message not an object", "POST", CHAT, chat(messages=["hi"]), 400, "messages[0]"),
    ("unknown role", "POST", CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), 400, "wizard"),
    ("content a number", "POST", CHAT, chat(messages=[{"role": "user", "content": 5}]), 400, "content"),
    ("content null for a user", "POST", CHAT, chat(messages=[{"role": "user", "content": None}]), 400, "content"),
    ("image part", "POST", CHAT, chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), 400,
     "image_url"),
    ("negative temperature", "POST", CHAT, chat(temperature=-1), 400, "temperature"),
    ("temperature a string", "POST", CHAT, chat(temperature="hot"), 400, "temperature"),
    ("top_p zero", "POST", CHAT, chat(top_p=0), 400, "top_p"),
    ("top_p above one", "POST", CHAT, chat(top_p=1.5), 400, "top_p"),
    ("top_k below -1", "POST", CHAT, chat(top_k=-2), 400, "top_k"),
    ("max_tokens zero", "POST", CHAT, chat(max_tokens=0), 400, "max_tokens"),
    ("huge max_tokens", "POST", CHAT, chat(max_tokens=10**9), 400, "context"),
    ("max_tokens a string", "POST", CHAT, chat(max_tokens="10"), 400, "max_tokens"),
    ("min_tokens above max_tokens", "POST", CHAT, chat(min_tokens=9), 400, "min_tokens"),
    ("ignore_eos not a bool", "POST", CHAT, chat(ignore_eos="no"), 400, "ignore_eos"),
    ("n=2", "POST", CHAT, chat(n=2), 400, "n:"),
    ("stop a number", "POST", CHAT, chat(stop=5), 400, "stop"),
    ("empty stop string", "POST", CHAT, chat(stop=[""]), 400, "stop"),
    ("seed a string", "POST", CHAT, chat(seed="abc"), 400, "seed"),
    ("stream not a bool", "POST", CHAT, chat(stream="yes"), 400, "stream"),
    ("stream_options without stream", "POST", CHAT, chat(stream_options={"include_usage": True}), 400,
     "stream_options"),
    ("unknown field", "POST", CHAT, chat(frobnicate=1), 400, "frobnicate"),
    ("logprobs", "POST", CHAT, chat(logprobs=True), 400, "logprobs"),
    ("presence penalty", "POST", CHAT, chat(presence_penalty=0.5), 400, "presence_penalty"),
    ("json mode", "POST", CHAT, chat(response_format={"type": "json_object"}), 400, "response_format"),
    ("tools not a list", "POST", CHAT, chat(tools={"name": "x"}), 400, "tools"),
    ("tool without a name", "POST", CHAT, chat(tools=[{"type": "function", "function": {}}]), 400, "name"),
    ("tool_choice required", "POST", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}],
                                                tool_choice="required"), 400, "tool_choice"),
    ("malformed tool call", "POST", CHAT,
     chat(messages=[*OK_MESSAGES, {"role": "assistant", "content": None, "tool_calls": [{"x": 1}]}]), 400,
     "tool_calls"),
    ("reserved template kwarg", "POST", CHAT, chat(chat_template_kwargs={"tokenize": True}), 400, "tokenize"),
    ("unknown kv_policy", "POST", CHAT, chat(kv_policy="lru", kv_budget=64), 400, "kv_policy"),
    ("kv_policy without a budget", "POST", CHAT, chat(kv_policy="snapkv"), 400, "kv_budget"),
    ("kv_budget with the full cache", "POST", CHAT, chat(kv_budget=64), 400, "kv_budget"),
    ("negative kv_budget", "POST", CHAT, chat(kv_policy="snapkv", kv_budget=-5), 400, "kv_budget"),
    ("kv_budget fraction above one", "POST", CHAT, chat(kv_policy="snapkv", kv_budget=1.5), 400, "kv_budget"),
    ("unknown kv_mode", "POST", CHAT, chat(kv_mode="sometimes"), 400, "kv_mode"),
    ("unknown policy option", "POST", CHAT, chat(kv_policy="snapkv", kv_budget=64, kv_policy_args={"q": 1}), 400,
     "kv_policy_args"),
    ("budget off nexus's block", "POST", CHAT, chat(kv_policy="nexus", kv_budget=100), 400, "kv_budget"),
    ("budget below the prompt", "POST", CHAT, chat(kv_policy="snapkv", kv_budget=4), 400, "budget"),
    ("completion without a prompt", "POST", DONE, json.dumps({"model": MODEL}), 400, "prompt"),
    ("completion token id outside the vocabulary", "POST", DONE, completion(prompt=[10**9]), 400, "vocabulary"),
    ("completion batch of two", "POST", DONE, completion(prompt=["a", "b"]), 400, "prompt"),
    ("completion echo", "POST", DONE, completion(echo=True), 400, "echo"),
    ("unknown path", "POST", "/v1/embeddings", chat(), 404, "/v1/embeddings"),
    ("wrong method", "GET", CHAT, None, 405, "Method"),
]  # fmt: skip


@pytest.fixture(scope="module")
def server(request, tiny_model, qwen3_tokenizer):
    from kvagent.runtime import Engine

    from .conftest import Served

    srv = Served(Engine.load(tiny_model, tokenizer=qwen3_tokenizer, device="cpu"))
    request.addfinalizer(srv.close)
    return srv


@pytest.mark.parametrize(
    ("name", "method", "path", "body", "status", "word"), CASES, ids=[c[0] for c in CASES]
)
def test_malformed_request_gets_a_one_line_4xx(server, name, method, path, body, status, word):
    r = httpx.request(method, server.url + path, content=body, timeout=60)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    message = r.json()["error"]["message"]
    assert message and "\n" not in message, message
    assert word in message, message


def test_at_least_25_kinds_and_the_server_keeps_serving(server):
    assert len(CASES) >= 25
    for _, method, path, body, status, _ in CASES:
        assert httpx.request(method, server.url + path, content=body, timeout=60).status_code == status
    m = server.metrics()
    assert not [k for k in m if k.startswith("kvagent_requests_total") and 'status="5' in k]
    assert sum(v for k, v in m.items() if k.startswith("kvagent_requests_total")) >= len(CASES)
    r = server.client.chat.completions.create(model=MODEL, messages=OK_MESSAGES, max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert httpx.get(server.url + "/health", timeout=30).json() == {"status": "ok"}
    # a failed first request left no session behind to be continued
    assert m["kvagent_live_sessions"] == 0


def test_models_lists_the_one_served_model_as_the_openai_client_reads_it(server):
    # Harnesses (litellm, mini-swe-agent) list models first; the id is the name requests must use,
    # and max_model_len is the context a client may size its requests to (vLLM's field).
    (card,) = server.client.models.list().data
    assert card.id == MODEL and card.object == "model" and card.owned_by == "kvagent"
    assert card.model_extra["max_model_len"] == server.engine.max_context > 0
    r = httpx.post(server.url + CHAT, content=chat(model=card.id + "-other"), timeout=60)
    assert r.status_code == 400, r.text
    assert card.id in r.json()["error"]["message"]
