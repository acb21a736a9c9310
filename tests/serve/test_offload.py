"""Idle sessions move out of memory instead of being dropped (--swap-space, --session-dir) and come
back exact: interleaved conversations under memory pressure continue their sessions and every
greedy reply equals the conversation served alone (the library's side, Replay); a server restarted
on its session dir continues them; kv_require_session answers 409 where a session is gone."""

from __future__ import annotations

import openai
import pytest

from kvagent.runtime import CacheConfig, persist

from .conftest import MODEL, Replay, head_of, prompt_of

CONFIG = CacheConfig(policy="snapkv", budget=24, buffer=8, protect="sink")  # rounds every 8 tokens


def user(conv: int, turn: int) -> dict:
    return {"role": "user", "content": f"Conversation {conv}, step {turn}: run the tests in calc/{conv}."}


def sizes(engine, tokenizer) -> tuple[int, int]:
    """(KV bytes of one session, bytes of its exported state) after a few turns' worth of tokens."""
    s = engine.session(CONFIG)
    s.append(prompt_of(tokenizer, [user(0, 0)]) * 4)
    return s.stats.total_kv_bytes, persist.export_session(s).nbytes


class Conversations:
    """n conversations played turn by turn, interleaved, against a server and the library alone."""

    def __init__(self, engine, tokenizer, n: int) -> None:
        self.tokenizer = tokenizer
        self.messages = [[{"role": "system", "content": "You are a coding agent."}] for _ in range(n)]
        self.replays = [Replay(engine, CONFIG) for _ in range(n)]

    def turn(self, srv, i: int, t: int, **extra):
        msgs = self.messages[i]
        msgs.append(user(i, t))
        r = srv.client.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=6, temperature=0, extra_body=extra or None
        )
        prompt = prompt_of(self.tokenizer, msgs)
        g, _ = self.replays[i].turn(prompt, 6, first=head_of(self.tokenizer, msgs))
        assert r.choices[0].message.content == g.text, f"conversation {i} turn {t}: differs from served alone"
        msgs.append({"role": "assistant", "content": r.choices[0].message.content})
        return r


def test_interleaved_conversations_swap_out_and_back_exactly(serve, solo_engine, qwen3_tokenizer):
    kv, state = sizes(solo_engine, qwen3_tokenizer)
    srv = serve(solo_engine, defaults=CONFIG, kv_memory=int(2.5 * kv), swap_space=int(6.9 * state))
    convs = Conversations(solo_engine, qwen3_tokenizer, 8)
    restored = []
    for t in range(6):
        for i in range(8):
            r = convs.turn(srv, i, t)
            info = r.model_extra["kvagent"]
            if t:
                assert info["status"] == "continued", f"conversation {i} turn {t}: {info['reason']}"
                restored.append(r.usage.model_dump()["kv_session_restored"])
    assert set(restored) == {"host"}, "every conversation came back from host memory"
    m = srv.metrics()
    assert not any(v for k, v in m.items() if k.startswith("kvagent_sessions_dropped_total"))
    assert m['kvagent_sessions_started_total{reason="new"}'] == 8
    assert m['kvagent_session_swap_ins_total{where="host"}'] == 40
    assert m['kvagent_session_swap_outs_total{where="host"}'] >= 40
    assert m["kvagent_sessions_swapped"] == 6 and m["kvagent_live_sessions"] == 2
    assert m['kvagent_session_swap_moved_bytes_total{direction="out"}'] > 40 * state * 0.5
    assert m['kvagent_session_swap_seconds_total{direction="in"}'] > 0


def test_swap_full_spills_to_disk_then_drops(serve, solo_engine, qwen3_tokenizer, tmp_path):
    """Host memory for 1 session: the least recently used go on to disk; without a disk they drop."""
    kv, state = sizes(solo_engine, qwen3_tokenizer)
    srv = serve(solo_engine, defaults=CONFIG, kv_memory=int(1.5 * kv), swap_space=int(1.5 * state),
                session_dir=str(tmp_path))  # fmt: skip
    convs = Conversations(solo_engine, qwen3_tokenizer, 4)
    for t in range(2):
        for i in range(4):
            r = convs.turn(srv, i, t)
            assert not t or r.model_extra["kvagent"]["status"] == "continued"
    m = srv.metrics()
    assert m['kvagent_session_swap_ins_total{where="disk"}'] >= 3 and m["kvagent_sessions_on_disk"] == 2
    srv2 = serve(solo_engine, defaults=CONFIG, kv_memory=int(1.5 * kv), swap_space=int(1.5 * state))
    convs = Conversations(solo_engine, qwen3_tokenizer, 3)
    for i in range(3):
        convs.turn(srv2, i, 0)
    m = srv2.metrics()
    assert m['kvagent_sessions_dropped_total{reason="kv_memory"}'] == 1  # the third: no room anywhere


def test_a_restarted_server_continues_from_its_session_dir(serve, solo_engine, qwen3_tokenizer, tmp_path):
    kv, _ = sizes(solo_engine, qwen3_tokenizer)
    opts = dict(defaults=CONFIG, kv_memory=int(2.5 * kv), session_dir=str(tmp_path))
    srv = serve(solo_engine, **opts)
    convs = Conversations(solo_engine, qwen3_tokenizer, 4)
    for t in range(3):
        for i in range(4):
            convs.turn(srv, i, t)
    srv.close()  # the drain saves every session
    assert len(list(tmp_path.glob("*.kvs"))) == 4
    srv2 = serve(solo_engine, **opts)
    assert srv2.metrics()["kvagent_sessions_on_disk"] == 4
    for t in range(3, 5):
        for i in range(4):
            r = convs.turn(srv2, i, t, kv_require_session=True)
            assert r.model_extra["kvagent"]["status"] == "continued"
            where = r.usage.model_dump()["kv_session_restored"]
            assert where == ("disk" if t == 3 else "none") or where == "disk"


def test_kv_require_session_answers_409_where_the_session_is_gone(serve, solo_engine, qwen3_tokenizer):
    srv = serve(solo_engine, defaults=CONFIG, kv_memory=1)  # only the newest session stays
    convs = Conversations(solo_engine, qwen3_tokenizer, 2)
    convs.turn(srv, 0, 0, kv_require_session=True)  # a first turn needs no session
    convs.turn(srv, 1, 0)  # conversation 0's session is dropped
    convs.messages[0].append(user(0, 1))
    for messages in (convs.messages[0], convs.messages[0][:1] + [user(5, 0)] + convs.messages[0][2:]):
        with pytest.raises(openai.ConflictError) as e:
            srv.client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=4, extra_body={"kv_require_session": True}
            )
        msg = e.value.body["message"]
        assert "\n" not in msg and msg.startswith("kv_require_session: ")
    assert "dropped for memory" in msg or "no session" in msg
    r = srv.client.chat.completions.create(model=MODEL, messages=convs.messages[0], max_tokens=4)
    assert r.model_extra["kvagent"]["reason"] == "dropped"  # without it: re-prefilled, as before
