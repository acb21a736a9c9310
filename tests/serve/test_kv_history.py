"""kv_history (issue #56): a chat request may ask for observation masking, every tool message but the
newest M. On a reprefill session the server re-renders them as the paper's placeholder line before
rendering the prompt, so the session follows the masked text; on a persistent one the text stays and
their content tokens are forgotten (no placeholder can enter the middle of a live cache)."""

from __future__ import annotations

import json

import pytest

from kvagent.serve.errors import RequestError
from kvagent.serve.protocol import parse_chat


def body(**kw):
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix it"}]
    for i in range(4):
        msgs += [{"role": "assistant", "content": f"call {i}"},
                 {"role": "tool", "content": "\n".join(f"out {i}.{j}" for j in range(i + 1)), "tool_call_id": f"c{i}"}]  # fmt: skip
    return json.dumps({"model": "m", "messages": msgs, **kw}).encode()


def masked(req):
    from kvagent.serve.history import mask_messages

    return mask_messages(req.messages, req.mask_keep) if req.mask_keep is not None else req.messages


def test_older_tool_messages_become_the_placeholder_line():
    req = parse_chat(body(kv_history="mask-observations=2"))
    tools = [m["content"] for m in masked(req) if m["role"] == "tool"]
    assert tools == ["Old environment output: (1 lines omitted)", "Old environment output: (2 lines omitted)",
                     "out 2.0\nout 2.1\nout 2.2", "out 3.0\nout 3.1\nout 3.2\nout 3.3"]  # fmt: skip
    assert masked(req)[1]["content"] == "fix it" and masked(req)[2]["content"] == "call 0"
    assert [m.get("tool_call_id") for m in masked(req) if m["role"] == "tool"] == ["c0", "c1", "c2", "c3"]
    kept = parse_chat(body(kv_history="keep"))
    assert masked(kept) == parse_chat(body()).messages and "out 0.0" in kept.messages[3]["content"]
    assert masked(parse_chat(body(kv_history="mask-observations"))) == parse_chat(body()).messages  # M=10


@pytest.mark.parametrize("bad", ["drop-thinking", "mask-observations=0", 3, "masks"])
def test_a_bad_kv_history_is_one_line_naming_the_field(bad):
    with pytest.raises(RequestError, match="kv_history"):
        parse_chat(body(kv_history=bad))


def _chat(n_tools: int, role: str = "tool") -> list[dict]:
    """`role` user: a harness acting in text (mini-swe-agent's default) sends outputs as user turns."""
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix it"}]
    for i in range(n_tools):
        out = {"role": role, "content": "\n".join(f"out {i}.{j}" for j in range(i + 2))}
        msgs += [
            {"role": "assistant", "content": f"call {i}"},
            {**out, "tool_call_id": f"c{i}"} if role == "tool" else out,
        ]
    return msgs


def test_observations_are_tool_messages_and_user_turns_after_the_first_reply():
    from kvagent.serve.history import mask_messages, observations

    assert observations(_chat(3)) == observations(_chat(3, "user")) == [3, 5, 7]
    text = mask_messages(_chat(3, "user"), 1)
    assert [m["content"] for m in text[:2]] == ["sys", "fix it"]  # the task is not an observation
    assert [m["content"][:4] for m in text[3::2]] == ["Old ", "Old ", "out "]


def test_reprefill_sessions_get_the_placeholder_text_and_persistent_ones_keep_it():
    """Which form applies is the session's mode's: parse_chat only reads M."""
    req = parse_chat(body(kv_history="mask-observations=2"))
    assert req.mask_keep == 2 and "out 0.0" in req.messages[3]["content"]
    assert parse_chat(body(kv_history="keep")).mask_keep is None


def test_a_reprefill_session_holds_the_placeholder_text(serve, solo_engine):
    from .conftest import MODEL

    srv = serve(solo_engine)
    extra = {"kv_history": "mask-observations=2", "kv_mode": "reprefill"}
    r = srv.client.chat.completions.create(
        model=MODEL, messages=_chat(4), max_tokens=3, temperature=0, extra_body=extra
    )
    assert r.usage.model_dump()["kv_forgotten_tokens"] == 0
    (conv,) = srv.app.state.server.conversations._live.values()
    text = solo_engine.tokenizer.decode(conv.session.history)
    assert "out 0.0" not in text and "out 1.0" not in text and "out 2.0\nout 2.1\nout 2.2" in text
    assert text.count("Old environment output: (") == 2


def test_tool_output_spans_are_their_content_tokens(qwen3_tokenizer):
    from kvagent.serve.render import prompt_ids

    req = parse_chat(
        json.dumps({"model": "m", "messages": _chat(3), "kv_history": "mask-observations=1"}).encode()
    )
    prompt = prompt_ids(qwen3_tokenizer, req, "kv_history")
    tools = [m["content"] for m in req.messages if m["role"] == "tool"]
    assert [qwen3_tokenizer.decode(prompt.ids[a:b]) for a, b in prompt.observations] == tools
    assert all(
        b2 > a2 > b1 for (_, b1), (a2, b2) in zip(prompt.observations, prompt.observations[1:], strict=False)
    )
    # a reply that quotes an output does not take its place: each is found after the message before it
    quoted = _chat(2)
    quoted[4]["content"] = quoted[3]["content"]  # the second reply repeats the first output
    req = parse_chat(
        json.dumps({"model": "m", "messages": quoted, "kv_history": "mask-observations=1"}).encode()
    )
    spans = prompt_ids(qwen3_tokenizer, req, "kv_history").observations
    assert spans[0][1] < spans[1][0]


@pytest.mark.parametrize(("role", "engine"), [("tool", "solo_engine"), ("user", "batch_engine")])
def test_persistent_sessions_forget_the_older_outputs_and_reply_as_the_library(
    serve, request, qwen3_tokenizer, role, engine
):
    """kv_history on a persistent session: nothing rewound or re-rendered; the outputs pushed out of
    the newest M leave the live cache (every layer and head) before the next output is fed, and each
    reply is the library's for the same stream with the same forgets (a batching engine: the
    session's rows in a pool block, its decode in the static step)."""
    from kvagent.runtime import CacheConfig, Sampling
    from kvagent.serve.render import prompt_ids

    from .conftest import MODEL

    eng = request.getfixturevalue(engine)
    steps = eng.step_runner.steps  # the solo engine is shared: count this test's steps only
    srv = serve(eng)
    extra = {"kv_history": "mask-observations=2", "kv_mode": "persistent"}
    cfg = CacheConfig()
    if engine == "batch_engine":  # a budget puts the session in a pool slot (dense ones stay private)
        cfg = CacheConfig(policy="snapkv", budget=256, buffer=16, protect="sink")
        extra |= {"kv_policy": "snapkv", "kv_budget": 256, "kv_buffer": 16, "kv_protect": "sink"}
    lib = eng.session(cfg)
    held = None
    for n_tools in (4, 5):
        msgs = _chat(n_tools, role)
        r = srv.client.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=6, temperature=0, extra_body=extra
        )
        usage = r.usage.model_dump()
        req = parse_chat(json.dumps({"model": "m", "messages": msgs, **extra}).encode())
        prompt = prompt_ids(qwen3_tokenizer, req, "kv_history")
        spans = prompt.observations
        gone = lambda k, spans=spans: [p for a, b in spans[:k] for p in range(a, b)]  # noqa: E731
        if n_tools == 4:  # a new session: the chat head fed whole, then outputs 0 and 1 forgotten
            assert r.model_extra["kvagent"]["status"] == "new"
            lib.append(prompt.ids[: prompt.first])
            assert lib.forget(gone(2)) == usage["kv_forgotten_tokens"] > 0
            lib.append(prompt.ids[prompt.first :])
        else:  # continued: output 2 is forgotten before output 4's content is fed
            # only the newest reply, which the client re-rendered ("call 4"), is taken back: no
            # re-render of the masked outputs reaches into the stream
            kv = r.model_extra["kvagent"]
            assert kv["status"] == "continued" and kv["divergence"] == "reply"
            keep = usage["kv_continued_tokens"]
            assert 0 < usage["kv_rewound_tokens"] == len(held) - keep and keep > spans[3][1]
            assert prompt.ids[:keep] == held[:keep]
            lib.rewind(len(held) - keep)
            lib.append(prompt.ids[keep : spans[4][0]])
            assert lib.forget(gone(3)) == usage["kv_forgotten_tokens"] == spans[2][1] - spans[2][0]
            lib.append(prompt.ids[spans[4][0] :])
        g = lib.generate(6, sampling=Sampling(temperature=0.0))
        assert r.choices[0].message.content == g.text
        held = list(lib.history)
    # the served session holds none of the masked outputs, anywhere
    (conv,) = srv.app.state.server.conversations._live.values()
    masked = set(gone(3))
    for layer in conv.session.kept_positions():
        for head in layer[0]:
            assert not {int(p) for p in head.tolist()} & masked
    assert conv.session.history == lib.history
    # the decode went through the static step where the session holds a pool slot (dense: eager)
    assert (eng.step_runner.steps > steps) == (engine == "batch_engine")
    # and its cache is the library's: the outputs fed after a forget never attended to what it forgot
    import torch

    for ours, theirs in zip(conv.session.cache.layers, lib.cache.layers, strict=True):
        (k, v, p), (k2, v2, p2) = ours.live(), theirs.live()
        assert torch.equal(p, p2)
        torch.testing.assert_close(k, k2, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v, v2, atol=1e-5, rtol=1e-5)
