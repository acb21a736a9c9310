"""A session dir under faults (issue 57.3): a saved session whose bytes changed after it was
written, one cut short, a `<id>.json` that no longer parses, a session file beside another
conversation's history. None of them is continued: each conversation whose session is gone gets
the 409 naming its one cause under kv_require_session, else restarts counted `dropped` with its
history re-prefilled; their files move to DIR/unreadable (one log line each) and are not found
again; ids are never given twice. The intact conversations continue exactly (Replay)."""

from __future__ import annotations

import json
import logging
import shutil
import time

import openai
import pytest

from kvagent.runtime import CacheConfig

from .conftest import MODEL, Replay, head_of, prompt_of

CONFIG = CacheConfig(policy="snapkv", budget=24, buffer=8, protect="sink")


class Convs:
    """Conversations played turn by turn against servers and against the library alone."""

    def __init__(self, engine, tokenizer, n: int) -> None:
        self.tokenizer = tokenizer
        self.messages = [[{"role": "system", "content": f"Agent {i}."}] for i in range(n)]
        self.replays = [Replay(engine, CONFIG) for _ in range(n)]
        self.ids: list[str | None] = [None] * n

    def ask(self, srv, i: int, t: int, **extra):
        msgs = self.messages[i]
        if msgs[-1]["role"] != "user":
            msgs.append(
                {"role": "user", "content": f"Conversation {i}, step {t}: run the tests in calc/{i}."}
            )
        return srv.client.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=6, temperature=0, extra_body=extra or None
        )

    def turn(self, srv, i: int, t: int, **extra):
        """A turn that must continue exactly (or start, at t == 0)."""
        r = self.ask(srv, i, t, **extra)
        msgs = self.messages[i]
        g, _ = self.replays[i].turn(prompt_of(self.tokenizer, msgs), 6, first=head_of(self.tokenizer, msgs))
        assert r.choices[0].message.content == g.text, f"conversation {i} turn {t}: differs from served alone"
        msgs.append({"role": "assistant", "content": r.choices[0].message.content})
        self.ids[i] = r.model_extra["kvagent"]["session"]
        return r

    def refused(self, srv, i: int, t: int) -> str:
        with pytest.raises(openai.ConflictError) as e:
            self.ask(srv, i, t, kv_require_session=True)
        msg = e.value.body["message"]
        assert "\n" not in msg and msg.startswith("kv_require_session: ")
        return msg


def played(serve, engine, tokenizer, tmp_path, n: int) -> Convs:
    """n conversations, two turns each, then a shutdown that saves every session in tmp_path."""
    srv = serve(engine, defaults=CONFIG, session_dir=str(tmp_path))
    convs = Convs(engine, tokenizer, n)
    for t in range(2):
        for i in range(n):
            convs.turn(srv, i, t)
    srv.close()
    assert sorted(p.stem for p in tmp_path.glob("*.kvs")) == sorted(convs.ids)
    return convs


def flip(path, tensor: str = "cache.layers.0.keys") -> None:
    """One byte of a tensor's data changed, the file's size and header intact."""
    data = bytearray(path.read_bytes())
    n = int.from_bytes(data[:8], "little")
    start, end = json.loads(data[8 : 8 + n])[tensor]["data_offsets"]
    data[8 + n + (start + end) // 2] ^= 0x08
    path.write_bytes(bytes(data))


def test_damaged_session_files_are_refused_named_and_set_aside(
    serve, solo_engine, qwen3_tokenizer, tmp_path, caplog
):
    convs = played(serve, solo_engine, qwen3_tokenizer, tmp_path, 3)
    flip(tmp_path / f"{convs.ids[1]}.kvs")  # silent: only the checksum sees it
    cut = tmp_path / f"{convs.ids[2]}.kvs"
    cut.write_bytes(cut.read_bytes()[:-100])  # cut short: seen at start
    (tmp_path / f".{convs.ids[0]}.kvs.x1y2z3.tmp").write_bytes(b"half")  # a killed writer's temp file
    caplog.set_level(logging.WARNING, logger="kvagent.serve")
    srv = serve(solo_engine, defaults=CONFIG, session_dir=str(tmp_path))
    m = srv.metrics()
    assert (
        m["kvagent_sessions_on_disk"] == 2 and m['kvagent_sessions_dropped_total{reason="unreadable"}'] == 1
    )
    assert not list(tmp_path.glob(".*.tmp"))
    for i in (1, 2):  # the damaged ones: refused with their one cause, never continued
        msg = convs.refused(srv, i, 2)
        assert "could not be read back" in msg and "for memory" not in msg and "lost" not in msg, msg
    aside = sorted(p.name for p in (tmp_path / "unreadable").iterdir())
    assert aside == sorted(f"{convs.ids[i]}{s}" for i in (1, 2) for s in (".kvs", ".json"))
    lines = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert len(lines) == 2 and all("\n" not in x for x in lines), lines
    assert "cut short" in " ".join(lines) and "checksum" in " ".join(lines)
    r = convs.turn(srv, 0, 2, kv_require_session=True)  # the intact one continues exactly
    assert (
        r.model_extra["kvagent"]["status"] == "continued"
        and r.usage.model_dump()["kv_session_restored"] == "disk"
    )
    for i in (1, 2):  # without it: started over, and said so (not `new` with nothing re-prefilled)
        r = convs.ask(srv, i, 2)
        info, usage = r.model_extra["kvagent"], r.usage.model_dump()
        assert (info["reason"], info["cause"]) == ("dropped", "unreadable"), info
        assert usage["kv_reprefilled_tokens"] > 0 and usage["kv_session_restored"] == "none"
    m = srv.metrics()
    assert m['kvagent_sessions_dropped_total{reason="unreadable"}'] == 2
    assert m['kvagent_sessions_started_total{reason="dropped"}'] == 2
    srv.close()
    srv = serve(solo_engine, defaults=CONFIG, session_dir=str(tmp_path))  # nothing unreadable counted again
    m = srv.metrics()
    assert m["kvagent_sessions_on_disk"] == 3
    assert not any(v for k, v in m.items() if k.startswith("kvagent_sessions_dropped_total"))


def test_a_session_file_of_another_conversation_is_never_continued(
    serve, solo_engine, qwen3_tokenizer, tmp_path
):
    """The pair `<id>.json` (this conversation's history) and `<id>.kvs` (another's session, a
    valid file): the session must prove it holds the history the request was matched by."""
    convs = played(serve, solo_engine, qwen3_tokenizer, tmp_path, 2)
    shutil.copyfile(tmp_path / f"{convs.ids[0]}.kvs", tmp_path / f"{convs.ids[1]}.kvs")
    srv = serve(solo_engine, defaults=CONFIG, session_dir=str(tmp_path))
    msg = convs.refused(srv, 1, 2)
    assert "could not be read back" in msg, msg
    assert (tmp_path / "unreadable" / f"{convs.ids[1]}.kvs").exists()
    r = convs.turn(srv, 0, 2, kv_require_session=True)
    assert r.model_extra["kvagent"]["status"] == "continued"


def test_session_ids_are_never_reused_in_a_session_dir(serve, solo_engine, qwen3_tokenizer, tmp_path):
    """A `<id>.json` that no longer parses: its id is not given to the next new conversation (whose
    marker would sit beside the other conversation's session), and its conversation, named from
    its session file, is refused as unreadable."""
    convs = played(serve, solo_engine, qwen3_tokenizer, tmp_path, 2)
    (tmp_path / f"{convs.ids[1]}.json").write_text("{garbage")
    srv = serve(solo_engine, defaults=CONFIG, session_dir=str(tmp_path))
    new = Convs(solo_engine, qwen3_tokenizer, 1)
    new.messages[0][0]["content"] = "Agent 9."
    new.turn(srv, 0, 0)
    assert new.ids[0] not in convs.ids and int(new.ids[0][1:]) > max(int(x[1:]) for x in convs.ids)
    assert "could not be read back" in convs.refused(srv, 1, 2)
    assert not (tmp_path / f"{convs.ids[1]}.kvs").exists()


def test_a_request_for_a_session_moving_out_waits_for_it(
    serve, batch_engine, solo_engine, qwen3_tokenizer, tmp_path
):
    """A conversation's next turn arriving while its idle session is being written out (another
    request's release moved it) is not `busy`: it waits for the move and continues from disk."""
    import threading

    srv = serve(batch_engine, defaults=CONFIG, kv_memory=1, session_dir=str(tmp_path))  # one stays in memory
    offload = srv.app.state.server.conversations.offload
    moving, move_out = threading.Event(), offload.move_out

    def slow_move_out(conv):
        moving.set()
        time.sleep(1.0)
        return move_out(conv)

    convs = Convs(solo_engine, qwen3_tokenizer, 2)
    convs.turn(srv, 0, 0)
    offload.move_out = slow_move_out
    other = threading.Thread(target=convs.turn, args=(srv, 1, 0))
    other.start()  # its release moves conversation 0 out, slowly
    assert moving.wait(timeout=120)
    r = convs.turn(srv, 0, 1, kv_require_session=True)
    other.join()
    assert r.model_extra["kvagent"]["status"] == "continued"
    assert r.usage.model_dump()["kv_session_restored"] == "disk"
