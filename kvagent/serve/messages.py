"""Chat messages and tool definitions as clients send them, checked and normalised for the chat
template: content parts joined to one string, a null content made "", keys the template does not
read dropped. Keys a client echoes back from an earlier response (litellm's `function_call`,
`provider_specific_fields`, ...) are ignored rather than refused, so harnesses that send the
assistant message they got back work unchanged."""

from __future__ import annotations

import json
from typing import Any

from kvagent.serve.errors import RequestError

ROLES = ("system", "developer", "user", "assistant", "tool")


def _content(where: str, content: Any, role: str) -> str:
    if content is None:
        if role == "assistant":  # a message that only calls tools
            return ""
        raise RequestError(f"{where}.content: missing; a {role} message needs text", param="messages")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                shown = json.dumps(kind) if kind is not None else "not a {type, text} object"
                raise RequestError(
                    f"{where}.content[{j}]: part type {shown} is not supported; send text parts only",
                    param="messages",
                )
            texts.append(part["text"])
        return "".join(texts)
    raise RequestError(
        f"{where}.content: expected a string or a list of text parts, got {type(content).__name__}",
        param="messages",
    )


def _tool_calls(where: str, calls: Any) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise RequestError(f"{where}.tool_calls: expected a list", param="messages")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestError(
                f'{where}.tool_calls[{j}]: expected {{"type": "function", "function": {{"name", '
                '"arguments"}}}',
                param="messages",
            )
        args = fn.get("arguments", "{}")
        if not isinstance(args, str | dict):
            raise RequestError(
                f"{where}.tool_calls[{j}].function.arguments: expected a JSON string", param="messages"
            )
        out.append(
            {"id": str(call.get("id") or f"call_{j}"), "type": "function",
             "function": {"name": fn["name"], "arguments": args}}
        )  # fmt: skip
    return out


def check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise RequestError("messages: expected a list of {role, content} objects", param="messages")
    if not messages:
        raise RequestError("messages: empty; send at least one message", param="messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where}: expected an object with role and content", param="messages")
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(
                f"{where}.role: {json.dumps(role)} is not a role; use one of {', '.join(ROLES)}",
                param="messages",
            )
        calls = m.get("tool_calls")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role}
        if calls:
            if role != "assistant":
                raise RequestError(
                    f"{where}.tool_calls: only assistant messages make calls", param="messages"
                )
            msg["tool_calls"] = _tool_calls(where, calls)
        msg["content"] = _content(where, m.get("content"), role)
        for key in ("name", "tool_call_id", "reasoning_content"):
            v = m.get(key)
            if v is None:
                continue
            if not isinstance(v, str):
                raise RequestError(f"{where}.{key}: expected a string", param="messages")
            msg[key] = v
        out.append(msg)
    return out


def check_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise RequestError("tools: expected a list of {type: function, function: {...}}", param="tools")
    out = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise RequestError(
                f'tools[{i}]: expected {{"type": "function", "function": {{"name", ...}}}}', param="tools"
            )
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestError(f"tools[{i}].function.name: missing", param="tools")
        if "parameters" in fn and not isinstance(fn["parameters"], dict):
            raise RequestError(
                f"tools[{i}].function.parameters: expected a JSON schema object", param="tools"
            )
        out.append({"type": "function", "function": fn})
    return out
