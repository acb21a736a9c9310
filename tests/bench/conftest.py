import json

import pytest

from kvagent.runtime import Engine


def _obs(i: int) -> str:
    lines = [f"    {n}\tdef helper_{i}_{n}(x):  return x * {n} + {i}" for n in range(1, 9)]
    return (
        f"Execution output of [file_editor]:\nHere's the result of running `cat -n` on /testbed/m{i}.py:\n"
        + "\n".join(lines)
    )


def record(rid: str = "fixture-1", turns: int = 6) -> dict:
    """A small normalised-JSONL record: function calls in `tool_calls`, observations as `tool`."""
    msgs = [
        {"role": "system", "content": "You are a coding agent. Call one tool per reply."},
        {"role": "user", "content": "Fix the off-by-one error in m3.py."},
    ]
    for i in range(turns):
        call = {"name": "file_editor", "arguments": json.dumps({"command": "view", "path": f"m{i}.py"})}
        if i % 2:  # the OpenAI shape appears in real records too
            call = {"id": f"c{i}", "type": "function", "function": call}
        msgs.append({"role": "assistant", "content": f"Let me look at m{i}.py.", "tool_calls": [call]})
        msgs.append({"role": "tool", "content": _obs(i)})
    msgs.append(
        {
            "role": "assistant",
            "content": "Done.",
            "tool_calls": [{"name": "finish", "arguments": '{"command": "submit"}'}],
        }
    )
    return {"id": rid, "scaffold": "test", "messages": msgs}


@pytest.fixture
def jsonl_file(tmp_path):
    path = tmp_path / "traj.jsonl"
    path.write_text("\n".join(json.dumps(record(f"fixture-{k}")) for k in (1, 2)) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tiny_engine():
    # The real Qwen3 tokenizer with a random 2-layer model: stream ids need the full vocabulary.
    return Engine.load("tiny-random-qwen3", device="cpu")
