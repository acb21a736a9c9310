"""A served conversation continues one live session: each turn appends only the tokens its prompt
does not share with the session's stream, and every greedy reply is the one Session.generate gives
on that same token stream (full cache and under eviction, where rounds span requests)."""

from __future__ import annotations

from kvagent.runtime import CacheConfig

from .conftest import MODEL, Replay, head_of, prompt_of

SYSTEM = {"role": "system", "content": "You are a careful coding agent. Answer briefly."}


def user(turn: int) -> dict:
    return {"role": "user", "content": f"Step {turn}: run the tests in calc/ and say which one failed."}


def converse(srv, tokenizer, replay: Replay, turns: int, max_tokens: int = 12, **extra):
    """Play `turns` turns against the server and the library side by side; returns each turn's
    (response, prompt ids, library generation, tokens the library kept)."""
    messages, out = [SYSTEM], []
    for turn in range(turns):
        messages.append(user(turn))
        r = srv.client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0, extra_body=extra or None
        )
        prompt = prompt_of(tokenizer, messages)
        g, keep = replay.turn(prompt, max_tokens, first=head_of(tokenizer, messages))
        out.append((r, prompt, g, keep))
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
    return out


def test_six_turns_continue_one_session_and_equal_the_library(serve, solo_engine, qwen3_tokenizer):
    srv = serve(solo_engine)
    turns = converse(srv, qwen3_tokenizer, Replay(solo_engine, CacheConfig()), 6)
    sessions = set()
    for i, (r, prompt, g, keep) in enumerate(turns):
        assert r.choices[0].message.content == g.text, f"turn {i}: the reply differs from Session.generate's"
        u = r.usage.model_dump()
        assert u["prompt_tokens"] == len(prompt)
        assert u["kv_continued_tokens"] == keep == u["prompt_tokens_details"]["cached_tokens"]
        assert u["kv_appended_tokens"] == len(prompt) - keep == u["kv_prefill_tokens"]
        assert u["completion_tokens"] == len(g.ids)
        kv = r.model_extra["kvagent"]
        sessions.add(kv["session"])
        if i:
            # the whole previous prompt (and the reply as far as it re-encodes) is not fed again
            assert keep >= len(turns[i - 1][1]), f"turn {i} re-fed part of the previous prompt"
            assert kv["status"] == "continued" and kv["divergence"] in ("none", "reply")
            assert u["kv_rewound_tokens"] == len(turns[i - 1][1]) + len(turns[i - 1][2].ids) - keep
        assert kv["logical_length"] == len(prompt) + len(g.ids)
    assert len(sessions) == 1
    m = srv.metrics()
    assert m['kvagent_sessions_started_total{reason="new"}'] == 1
    assert sum(v for k, v in m.items() if k.startswith("kvagent_sessions_started_total")) == 1
    assert m["kvagent_live_sessions"] == 1
    assert m["kvagent_prefill_tokens_total"] == sum(len(p) - k for _, p, _, k in turns)
    assert m["kvagent_continued_tokens_total"] == sum(k for *_, k in turns)
    assert m["kvagent_prompt_tokens_total"] == sum(len(p) for _, p, _, _ in turns)
    assert sum(m[f'kvagent_session_continuations_total{{divergence="{d}"}}'] for d in ("none", "reply")) == 5


def test_under_eviction_rounds_span_requests_and_replies_equal_the_library(
    serve, solo_engine, qwen3_tokenizer
):
    srv = serve(solo_engine)
    replay = Replay(solo_engine, CacheConfig(policy="snapkv", budget=48, buffer=8))
    turns = converse(srv, qwen3_tokenizer, replay, 6, kv_policy="snapkv", kv_budget=48, kv_buffer=8)
    rounds = [r.model_extra["kvagent"]["rounds"] for r, *_ in turns]
    per_request = [r.model_extra["kvagent"]["eviction_rounds_this_request"] for r, *_ in turns]
    for i, (r, _, g, _) in enumerate(turns):
        assert r.choices[0].message.content == g.text, f"turn {i}: the reply differs from Session.generate's"
        assert r.model_extra["kvagent"]["policy"] == "snapkv"
    assert len({r.model_extra["kvagent"]["session"] for r, *_ in turns}) == 1
    assert sum(n > 0 for n in per_request) >= 3, f"rounds did not continue across requests: {per_request}"
    assert rounds == sorted(rounds) and rounds[-1] == sum(per_request) == replay.session.stats.rounds
    assert turns[-1][0].model_extra["kvagent"]["evicted"] == replay.session.stats.evicted > 0
    m = srv.metrics()
    assert m["kvagent_eviction_rounds_total"] == rounds[-1]
    assert m['kvagent_sessions_started_total{reason="new"}'] == 1


def test_divergence_before_the_newest_reply_rewinds_deeper_and_inside_the_first_prompt_starts_anew(
    serve, solo_engine, qwen3_tokenizer
):
    srv = serve(solo_engine)
    replay = Replay(solo_engine, CacheConfig())
    turns = converse(srv, qwen3_tokenizer, replay, 3)
    messages = [SYSTEM]
    for i, (r, *_rest) in enumerate(turns):
        messages += [user(i), {"role": "assistant", "content": r.choices[0].message.content}]
    # the client rewrites its second user message: the divergence is before the newest reply
    edited = messages[:3] + [{"role": "user", "content": "Step 1, again: only list the files."}]
    r = srv.client.chat.completions.create(model=MODEL, messages=edited, max_tokens=12, temperature=0)
    prompt = prompt_of(qwen3_tokenizer, edited)
    g, keep = replay.turn(prompt, 12)
    kv, u = r.model_extra["kvagent"], r.usage.model_dump()
    assert kv["status"] == "continued" and kv["divergence"] == "deeper"
    assert r.choices[0].message.content == g.text
    assert u["kv_continued_tokens"] == keep and keep < len(turns[1][1])
    assert u["kv_rewound_tokens"] == len(turns[2][1]) + len(turns[2][2].ids) - keep
    # a different first question shares only the system prompt: a new session
    other = [SYSTEM, {"role": "user", "content": "Something else entirely."}]
    replay2 = Replay(solo_engine, CacheConfig())
    prompt2 = prompt_of(qwen3_tokenizer, other)
    r2 = srv.client.chat.completions.create(model=MODEL, messages=other, max_tokens=4, temperature=0)
    g2, _ = replay2.turn(prompt2, 4, first=head_of(qwen3_tokenizer, other))
    assert (
        r2.model_extra["kvagent"]["status"] == "new" and r2.model_extra["kvagent"]["session"] != kv["session"]
    )
    assert r2.choices[0].message.content == g2.text
    # the first turn asked again: the first append stopped before the generation prompt, so the
    # reply (and the prompt's last token, for its logits) is rewound and the session continues
    r3 = srv.client.chat.completions.create(model=MODEL, messages=other, max_tokens=4, temperature=0)
    g3, keep3 = replay2.turn(prompt2, 4)
    kv3 = r3.model_extra["kvagent"]
    assert kv3["session"] == r2.model_extra["kvagent"]["session"] and kv3["divergence"] == "reply"
    assert r3.choices[0].message.content == g3.text
    assert r3.usage.model_dump()["kv_continued_tokens"] == keep3 == len(prompt2) - 1
    # a reply dropped by the client (mini-swe-agent does after a format error) and a new turn:
    # the divergence is at the generation prompt, still the newest reply's place
    dropped = [*other, {"role": "user", "content": "Please call a tool."}]
    r4 = srv.client.chat.completions.create(model=MODEL, messages=dropped, max_tokens=4, temperature=0)
    g4, _ = replay2.turn(prompt_of(qwen3_tokenizer, dropped), 4)
    assert (
        r4.model_extra["kvagent"]["status"] == "continued"
        and r4.model_extra["kvagent"]["divergence"] == "reply"
    )
    assert r4.choices[0].message.content == g4.text
    # a completion prompt asked again has nothing left to rewind to: a new session
    srv.client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=3, temperature=0)
    again = srv.client.completions.create(model=MODEL, prompt="def f(x):", max_tokens=3, temperature=0)
    assert again.model_extra["kvagent"]["reason"] == "diverged"
    m = srv.metrics()
    assert m['kvagent_session_continuations_total{divergence="deeper"}'] == 1
    assert m['kvagent_sessions_started_total{reason="diverged"}'] == 1
