"""From a public agent trajectory to a replay record's messages: one converter per source format.

Each converter takes the source file's bytes (and, for a JSONL file, the 1-based line) and returns
the episode's messages (`role`, `content`, and where the model used function calling `tool_calls`
/ `tool_call_id` in the OpenAI shape); `CONVERTERS` names them, and the episode manifest
(`bench/manifest.py`) says which one makes each record. They keep the source's texts verbatim:
what a converter drops or joins is said in its docstring and in the record's `notes`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kvagent.errors import KvagentError

Message = dict[str, Any]


def _json(data: bytes, line: int | None, what: str) -> Any:
    text = data.decode("utf-8")
    if line is not None:
        rows = text.split("\n")
        if not 1 <= line <= len(rows) or not rows[line - 1].strip():
            raise KvagentError(f"{what}: the source has no line {line}")
        text = rows[line - 1]
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise KvagentError(f"{what}: the source is not JSON ({e})") from None


def _text(content: Any) -> str:
    """A message's text: a string as is, a list of parts as their text parts joined, None as ''."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls in the OpenAI shape, the source's extra keys (`index`) dropped."""
    return [
        {
            "id": c.get("id"),
            "type": c.get("type", "function"),
            "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
        }
        for c in calls
    ]


def sweagent_0x(data: bytes, line: int | None = None) -> list[Message]:
    """SWE-agent 0.x `.traj`: the `history`, each entry's role and content (observations are `user`
    messages; the in-context demonstration is kept)."""
    traj = _json(data, line, "sweagent-0.x")
    return [{"role": h["role"], "content": _text(h.get("content"))} for h in traj["history"]]


def sweagent_1x(data: bytes, line: int | None = None) -> list[Message]:
    """SWE-agent 1.x `.traj` (function calling): the `history`; an assistant message keeps its text
    and `tool_calls`, an observation is a `tool` message answering its first `tool_call_ids`."""
    traj = _json(data, line, "sweagent-1.x")
    out: list[Message] = []
    for h in traj["history"]:
        m: Message = {"role": h["role"], "content": _text(h.get("content"))}
        if h["role"] == "assistant" and h.get("tool_calls"):
            m["tool_calls"] = _calls(h["tool_calls"])
        elif h["role"] == "tool" and h.get("tool_call_ids"):
            m["tool_call_id"] = h["tool_call_ids"][0]
        out.append(m)
    return out


def minisweagent(data: bytes, line: int | None = None) -> list[Message]:
    """mini-swe-agent `.traj.json` (tool calling): `messages`, the final `exit` marker (the
    submission) dropped; empty assistant content is ''."""
    traj = _json(data, line, "mini-swe-agent")
    out: list[Message] = []
    for h in traj["messages"]:
        if h["role"] == "exit":
            continue
        m: Message = {"role": h["role"], "content": _text(h.get("content"))}
        if h["role"] == "assistant" and h.get("tool_calls"):
            m["tool_calls"] = _calls(h["tool_calls"])
        elif h["role"] == "tool" and h.get("tool_call_id"):
            m["tool_call_id"] = h["tool_call_id"]
        out.append(m)
    return out


def openhands(data: bytes, line: int | None = None) -> list[Message]:
    """An OpenHands `output.jsonl` line: its event `history`. The system and user message events as
    such; an agent action as the raw model response that made it (content + `tool_calls`, once per
    response); an observation of a call as a `tool` message (its content); an error observation as
    a `tool` message without a call id; recall (workspace context) events skipped."""
    row = _json(data, line, "openhands")
    out: list[Message] = []
    seen_responses: set[str] = set()
    for e in row["history"]:
        meta = e.get("tool_call_metadata") or {}
        if e.get("action") in ("system", "message"):
            out.append(
                {"role": "system" if e["action"] == "system" else "user", "content": e["args"]["content"]}
            )
        elif e.get("action") == "recall" or e.get("observation") == "recall":
            continue
        elif "action" in e and meta:
            response = meta["model_response"]
            if response["id"] in seen_responses:
                continue
            seen_responses.add(response["id"])
            msg = response["choices"][0]["message"]
            m: Message = {"role": "assistant", "content": _text(msg.get("content"))}
            if msg.get("tool_calls"):
                m["tool_calls"] = _calls(msg["tool_calls"])
            out.append(m)
        elif "observation" in e and meta:
            out.append(
                {"role": "tool", "content": _text(e.get("content")), "tool_call_id": meta["tool_call_id"]}
            )
        elif e.get("observation") == "error":
            out.append({"role": "tool", "content": _text(e.get("content"))})
        else:
            raise KvagentError(f"openhands: event {e.get('id')} is neither an action nor an observation")
    return out


def r2egym_steps(data: bytes, line: int | None = None) -> list[Message]:
    """An R2E-Gym trajectory line (`trajectory_steps`): the agent's system prompt, its instance
    prompt filled with the working directory /testbed and the problem statement, then per step the
    assistant's thought + blank line + action (the XML `<function=...>` call) and the observation
    as a `tool` message."""
    row = _json(data, line, "r2egym")
    args = row["agent_args"]
    task = args["instance_prompt"].replace("{working_dir}", "/testbed")
    task = task.replace("{problem_statement}", row["problem_statement"])
    out: list[Message] = [
        {"role": "system", "content": args["system_prompt"]},
        {"role": "user", "content": task},
    ]
    for step in row["trajectory_steps"]:
        out.append({"role": "assistant", "content": f"{step['thought']}\n\n{step['action']}"})
        out.append({"role": "tool", "content": step["observation"]})
    return out


def chat_input(data: bytes, line: int | None = None) -> list[Message]:
    """A chat-format SFT line: its `input` messages, verbatim."""
    row = _json(data, line, "chat-input")
    return [dict(m) for m in row["input"]]


CONVERTERS: dict[str, Callable[[bytes, int | None], list[Message]]] = {
    "sweagent-0.x": sweagent_0x,
    "sweagent-1.x": sweagent_1x,
    "mini-swe-agent": minisweagent,
    "openhands": openhands,
    "r2egym-steps": r2egym_steps,
    "chat-input": chat_input,
}


def stats(messages: list[Message]) -> dict[str, Any]:
    """The record's `stats`: counts per role, characters (content plus the tool calls' JSON), which
    role observations take and whether calls are in a `tool_calls` field."""
    roles = [m["role"] for m in messages]
    return {
        "n_messages": len(messages),
        "n_assistant": roles.count("assistant"),
        "n_tool": roles.count("tool"),
        "n_user": roles.count("user"),
        "n_chars": sum(
            len(m["content"]) + (len(json.dumps(m["tool_calls"])) if "tool_calls" in m else 0)
            for m in messages
        ),
        "observation_role": "tool" if "tool" in roles else "user",
        "has_tool_calls_field": any("tool_calls" in m for m in messages),
    }
