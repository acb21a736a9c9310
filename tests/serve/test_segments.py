"""kv_policy segments through the server: the segment-aware policy groups by the messages a harness
sends, so the server marks where each one from the first reply on starts (and where the reply it
samples starts), as the agent loop marks its replies and observations; the replies and keep-sets
equal the library's with the same marks."""

from __future__ import annotations

import torch

from kvagent.runtime import CacheConfig, Sampling

from .conftest import MODEL, head_of, prompt_of


def _chat(n: int) -> list[dict]:
    msgs = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "calc/add.py is wrong"},
    ]
    for i in range(n):
        msgs += [{"role": "assistant", "content": f"I will look at file number {i} now."},
                 {"role": "user", "content": "\n".join(f"line {i}.{j} of the output" for j in range(3 + i))}]  # fmt: skip
    return msgs


def _starts(tokenizer, messages, prompt: list[int]) -> list[int]:
    """Where each message's content from the first reply on begins in the prompt, found token by
    token (the decoded span starts with it), and the reply's own start."""
    out, cursor = [], 0
    for m in messages[2:]:
        cursor = next(
            a for a in range(cursor, len(prompt)) if tokenizer.decode(prompt[a:]).startswith(m["content"])
        )
        out.append(cursor)
    return [*out, len(prompt)]


def test_a_segments_session_marks_each_message_and_replies_as_the_library(
    serve, solo_engine, qwen3_tokenizer
):
    srv = serve(solo_engine)
    cfg = CacheConfig(policy="segments", budget=48, buffer=16, protect="sink")
    extra = {"kv_policy": "segments", "kv_budget": 48, "kv_buffer": 16, "kv_protect": "sink"}
    lib, marks = solo_engine.session(cfg), set()
    for n in (2, 4):
        msgs = _chat(n)
        r = srv.client.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=5, temperature=0, extra_body=extra
        )
        prompt = prompt_of(qwen3_tokenizer, msgs)
        keep = r.usage.model_dump()["kv_continued_tokens"]
        if lib.history:  # the library continues as the server did: the shared prefix kept
            lib.rewind(lib.logical_length - keep)
        new = [p for p in _starts(qwen3_tokenizer, msgs, prompt) if p >= keep]
        for p in new:
            lib.mark_segment(p)
        marks = {m for m in marks if m <= keep} | set(new)
        if not lib.history:
            first = head_of(qwen3_tokenizer, msgs)
            lib.append(prompt[:first])
            lib.append(prompt[first:])
        else:
            lib.append(prompt[keep:])
        g = lib.generate(5, sampling=Sampling(temperature=0.0))
        assert r.choices[0].message.content == g.text
    (conv,) = srv.app.state.server.conversations._live.values()
    session = conv.session
    assert session.stats.rounds > 2 and len(session.segment_starts) >= 8
    assert set(session.segment_starts) == marks == set(lib.segment_starts)
    for a, b in zip(session.kept_positions(), lib.kept_positions(), strict=True):
        assert torch.equal(a, b)
