"""Hermes-style tool calls, the Qwen family's format: a call is `<tool_call>{"name": ..., "arguments":
{...}}</tool_call>` in the reply. `parse` turns such blocks into OpenAI `tool_calls` and leaves
everything else (R2E-Gym's `<function=...>` text calls included) as content. For chat templates
that know nothing of tools (SmolLM2's), `fold_tools` writes the tool list into the system message
and earlier calls and results into the turns, in the same format, so any chatml model can be
offered tools."""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass
class Parsed:
    content: str | None
    tool_calls: list[dict[str, Any]]


def _call(payload: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(payload)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": obj["name"], "arguments": args},
    }


def parse(text: str) -> Parsed:
    """Calls out of a reply; a block that is not a JSON call (or an unclosed one) stays content.
    Content keeps its text as written, less the parsed blocks and trailing whitespace; None if
    nothing else was said."""
    calls, kept, last = [], [], 0
    for m in _BLOCK.finditer(text):
        call = _call(m.group(1))
        if call is None:
            continue
        kept.append(text[last : m.start()])
        last = m.end()
        calls.append(call)
    if not calls:
        return Parsed(text, [])
    kept.append(text[last:])
    content = "".join(kept).rstrip()
    return Parsed(content or None, calls)


def safe_prefix(text: str) -> str:
    """What of a reply still being written can be streamed as content when tools are offered: text
    before any (possibly partial) `<tool_call>`, without trailing whitespace (the final content is
    right-stripped around calls)."""
    cut = text.find(OPEN)
    if cut < 0:
        cut = len(text)
        for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
            if text.endswith(OPEN[:k]):
                cut = len(text) - k
                break
    return text[:cut].rstrip()


# ----------------------------------------------------------------------------- templates without tools
def _tools_block(tools: list[dict[str, Any]]) -> str:
    listing = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou can call these functions. Their signatures, one per line, inside <tools></tools>:\n"
        f"<tools>\n{listing}\n</tools>\n\n"
        "To call one, write a JSON object with its name and arguments inside <tool_call></tool_call> tags:\n"
        '<tool_call>\n{"name": "<function-name>", "arguments": {"<arg>": "<value>"}}\n</tool_call>'
    )


def render_call(call: dict[str, Any]) -> str:
    fn = call["function"]
    args = fn["arguments"]
    if isinstance(args, str):
        with contextlib.suppress(json.JSONDecodeError):  # else written as the client sent it
            args = json.loads(args)
    return f"{OPEN}\n{json.dumps({'name': fn['name'], 'arguments': args}, ensure_ascii=False)}\n{CLOSE}"


def fold_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Messages for a template that has no tool support: tools in the system message, calls in
    the assistant text, results as user turns in <tool_response> tags."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            text = "\n".join([m["content"], *(render_call(c) for c in m["tool_calls"])]).lstrip("\n")
            out.append({"role": "assistant", "content": text})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    if tools:
        block = _tools_block(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out
