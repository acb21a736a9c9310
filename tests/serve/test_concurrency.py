"""Many conversations at once on the batching engine: all complete and equal their solo runs
(greedy, full cache) with forwards shared (mean batch > 1 in /metrics); the queue is bounded (429);
idle sessions past --kv-memory are dropped least recently used and their next request restarts."""

from __future__ import annotations

import threading
import time

import httpx

from kvagent.runtime import CacheConfig

from .conftest import MODEL, Replay, head_of, prompt_of

TURNS = 3


def conversation(i: int, turn: int) -> dict:
    return {
        "role": "user",
        "content": f"Agent {i}, step {turn}: open file_{i}.py and fix bug #{i * 7 + turn}.",
    }


def test_eight_concurrent_conversations_equal_their_solo_runs(
    serve, batch_engine, solo_engine, qwen3_tokenizer
):
    srv = serve(batch_engine)
    n = 8
    transcripts: list[list] = [[] for _ in range(n)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def run(i: int) -> None:
        try:
            messages = [{"role": "system", "content": "You fix bugs."}]
            barrier.wait(timeout=60)
            for turn in range(TURNS):
                messages.append(conversation(i, turn))
                r = srv.client.chat.completions.create(
                    model=MODEL, messages=messages, max_tokens=16, temperature=0
                )
                transcripts[i].append((list(messages), r))
                messages.append({"role": "assistant", "content": r.choices[0].message.content})
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors[0]
    assert all(len(t) == TURNS for t in transcripts)
    for i, turns in enumerate(transcripts):  # solo: the library on an engine that never batches
        replay = Replay(solo_engine, CacheConfig())
        for turn, (messages, r) in enumerate(turns):
            first = head_of(qwen3_tokenizer, messages)
            g, keep = replay.turn(prompt_of(qwen3_tokenizer, messages), 16, first=first)
            assert r.choices[0].message.content == g.text, (
                f"conversation {i} turn {turn} differs from its solo run"
            )
            assert r.usage.model_dump()["kv_continued_tokens"] == keep
        assert len({r.model_extra["kvagent"]["session"] for _, r in turns}) == 1
    m = srv.metrics()
    assert m["kvagent_batch_size_mean"] > 1, m["kvagent_batch_size_mean"]
    assert m["kvagent_batch_rows_total"] > m["kvagent_batch_forwards_total"] > 0
    assert m['kvagent_sessions_started_total{reason="new"}'] == n and m["kvagent_live_sessions"] == n
    assert m["kvagent_static_steps_total"] == 0  # full caches hold no pool slot: every forward eager
    # ... and /metrics says why: prefill chunks, and decode tokens of caches outside the pools
    eager = {r: m[f'kvagent_eager_forwards_total{{reason="{r}"}}'] for r in ("prefill", "private", "mode")}
    assert eager["private"] > 0 and eager["prefill"] > 0 and eager["mode"] == 0
    assert eager["private"] + eager["prefill"] == m["kvagent_batch_forwards_total"]


def _running(srv, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while srv.metrics()["kvagent_requests_running"] < count:
        assert time.monotonic() < deadline, "the long request never started"
        time.sleep(0.1)


def test_a_full_queue_answers_429_and_a_busy_conversation_gets_its_own_session(
    serve, solo_engine, batch_engine
):
    messages = [{"role": "user", "content": "Count to a thousand."}]
    long = {"model": MODEL, "messages": messages, "max_tokens": 4000, "ignore_eos": True, "stream": True}
    srv = serve(solo_engine, max_queue=0)  # one request at a time, none waiting
    with httpx.Client(timeout=60) as c, c.stream("POST", f"{srv.url}/v1/chat/completions", json=long) as r:
        assert r.status_code == 200
        _running(srv, 1)
        refused = httpx.post(f"{srv.url}/v1/chat/completions", json={**long, "stream": False}, timeout=60)
        assert refused.status_code == 429 and "busy" in refused.json()["error"]["message"]
        assert refused.headers["retry-after"] == "1"
    assert srv.metrics()['kvagent_requests_rejected_total{reason="queue_full"}'] == 1

    srv2 = serve(batch_engine)
    with httpx.Client(timeout=60) as c, c.stream("POST", f"{srv2.url}/v1/chat/completions", json=long) as r:
        _running(srv2, 1)
        follow = [
            *messages,
            {"role": "assistant", "content": "1, 2, 3"},
            {"role": "user", "content": "Go on."},
        ]
        r2 = srv2.client.chat.completions.create(model=MODEL, messages=follow, max_tokens=3, temperature=0)
        assert r2.model_extra["kvagent"]["reason"] == "busy"
    assert srv2.metrics()['kvagent_sessions_started_total{reason="busy"}'] == 1


def test_idle_sessions_past_kv_memory_are_dropped_lru_and_restart(serve, solo_engine):
    srv = serve(solo_engine, kv_memory=1)  # any held KV exceeds it: at most the newest session stays
    a = [{"role": "user", "content": "Conversation A: list the files."}]
    b = [{"role": "user", "content": "Conversation B: run the tests."}]
    ra = srv.client.chat.completions.create(model=MODEL, messages=a, max_tokens=6, temperature=0)
    rb = srv.client.chat.completions.create(model=MODEL, messages=b, max_tokens=6, temperature=0)
    m = srv.metrics()
    assert m['kvagent_sessions_dropped_total{reason="kv_memory"}'] == 1 and m["kvagent_live_sessions"] == 1
    a += [
        {"role": "assistant", "content": ra.choices[0].message.content},
        {"role": "user", "content": "And now?"},
    ]
    ra2 = srv.client.chat.completions.create(model=MODEL, messages=a, max_tokens=6, temperature=0)
    kv, u = ra2.model_extra["kvagent"], ra2.usage.model_dump()
    assert kv["status"] == "new" and kv["reason"] == "dropped"
    assert u["kv_continued_tokens"] == 0 and u["kv_reprefilled_tokens"] >= ra.usage.prompt_tokens
    assert kv["session"] not in (ra.model_extra["kvagent"]["session"], rb.model_extra["kvagent"]["session"])
    m = srv.metrics()
    assert m['kvagent_sessions_started_total{reason="dropped"}'] == 1
    assert m['kvagent_sessions_dropped_total{reason="kv_memory"}'] == 2  # B went when A came back
    assert m["kvagent_kv_memory_limit_bytes"] == 1


def test_the_least_recently_used_idle_session_is_the_one_dropped(serve, solo_engine):
    # Two sessions at most (the count limit shares the byte limit's victim rule): A, then B, then A
    # again; a third conversation C must drop B (used longest ago), not A (created first).
    srv = serve(solo_engine, max_sessions=2)

    def ask(messages):
        r = srv.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
        return r, messages + [{"role": "assistant", "content": r.choices[0].message.content}]

    _, a = ask([{"role": "user", "content": "Conversation A: list the files."}])
    _, b = ask([{"role": "user", "content": "Conversation B: run the tests."}])
    ra, a = ask(a + [{"role": "user", "content": "And now?"}])
    assert ra.model_extra["kvagent"]["status"] == "continued"
    ask([{"role": "user", "content": "Conversation C: read the README."}])
    assert srv.metrics()['kvagent_sessions_dropped_total{reason="max_sessions"}'] == 1
    ra, _ = ask(a + [{"role": "user", "content": "Next?"}])
    assert ra.model_extra["kvagent"]["status"] == "continued"  # A survived
    rb, _ = ask(b + [{"role": "user", "content": "And now?"}])
    assert rb.model_extra["kvagent"]["status"] == "new" and rb.model_extra["kvagent"]["reason"] == "dropped"


def test_a_new_conversation_counts_its_slot_and_moves_into_the_one_an_idle_session_left(
    serve, tiny_model, qwen3_tokenizer
):
    """An evicting session's pool slot is held from its start, so a new conversation past
    --kv-memory drops the least recently used idle one at once, and its first append moves it into
    the slot that freed: the live sessions share one pool block (one static decode batch) and the
    block it was given first is handed back."""
    from kvagent.runtime import Engine

    engine = Engine.load(tiny_model, tokenizer=qwen3_tokenizer, device="cpu", max_batch=2)
    cfg = CacheConfig(policy="random", budget=24, buffer=8, protect="sink")
    try:
        probe = engine.session(cfg)
        pool, slot_bytes = probe.evictor.slot.pool, probe.stats.total_kv_bytes
        assert slot_bytes == pool.slot_nbytes() > 0
        del probe
        srv = serve(engine, defaults=cfg, kv_memory=2 * slot_bytes)
        for name in ("W", "A", "B"):  # W takes block 0's first slot, A its second, B a new block
            r = srv.client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"Conversation {name}: list the files."}],
                max_tokens=4,
                temperature=0,
            )
            assert r.model_extra["kvagent"]["status"] == "new"
        m = srv.metrics()
        assert (
            m['kvagent_sessions_dropped_total{reason="kv_memory"}'] == 1 and m["kvagent_live_sessions"] == 2
        )
        assert m["kvagent_kv_bytes"] == 2 * slot_bytes
        # the replies' decode tokens took the static step (evicting sessions in a pool slot)
        assert 0 < m["kvagent_static_steps_total"] <= m["kvagent_batch_forwards_total"]
        blocks = len(pool.blocks)  # (the list's repr would print every slab)
        assert blocks == 1 and pool.in_use == 2
    finally:
        engine.close()
