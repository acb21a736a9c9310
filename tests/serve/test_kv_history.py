"""kv_history (issue #56): a chat request may ask for observation masking; the server re-renders
every tool message but the newest M as the paper's placeholder line before rendering the prompt, so
the live session follows the masked text (the changed suffix is taken back and appended again)."""

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


def test_older_tool_messages_become_the_placeholder_line():
    req = parse_chat(body(kv_history="mask-observations=2"))
    tools = [m["content"] for m in req.messages if m["role"] == "tool"]
    assert tools == ["Old environment output: (1 lines omitted)", "Old environment output: (2 lines omitted)",
                     "out 2.0\nout 2.1\nout 2.2", "out 3.0\nout 3.1\nout 3.2\nout 3.3"]  # fmt: skip
    assert req.messages[1]["content"] == "fix it" and req.messages[2]["content"] == "call 0"
    assert [m.get("tool_call_id") for m in req.messages if m["role"] == "tool"] == ["c0", "c1", "c2", "c3"]
    kept = parse_chat(body(kv_history="keep"))
    assert kept.messages == parse_chat(body()).messages and "out 0.0" in kept.messages[3]["content"]
    assert parse_chat(body(kv_history="mask-observations")).messages == parse_chat(body()).messages  # M=10


@pytest.mark.parametrize("bad", ["drop-thinking", "mask-observations=0", 3, "masks"])
def test_a_bad_kv_history_is_one_line_naming_the_field(bad):
    with pytest.raises(RequestError, match="kv_history"):
        parse_chat(body(kv_history=bad))
