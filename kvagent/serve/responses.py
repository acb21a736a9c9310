"""OpenAI response bodies and stream chunks from a finished (or growing) reply. Beside the API's
own fields, `usage` carries the kv_* token counts and the body a `kvagent` object (the session, how
the request used it, its cache statistics); docs/serve.md lists them."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from kvagent.serve import toolcalls
from kvagent.serve.runner import Outcome

# Session.generate's finish reasons as OpenAI names them ("abort": ended by the client or a drain)
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "interrupted": "abort"}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _message(text: str, tools_on: bool) -> tuple[str | None, list[dict[str, Any]]]:
    if not tools_on:
        return text, []
    parsed = toolcalls.parse(text)
    return parsed.content, parsed.tool_calls


def _finish_reason(outcome: Outcome, calls: list) -> str:
    return "tool_calls" if calls else FINISH[outcome.decoded.finish_reason]


def chat_body(rid: str, model: str, outcome: Outcome, tools_on: bool) -> dict[str, Any]:
    content, calls = _message(outcome.decoded.text, tools_on)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"kvagent-{outcome.stats['session']}",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": _finish_reason(outcome, calls),
            }
        ],
        "usage": outcome.usage,
        "kvagent": outcome.stats,
    }


def completion_body(rid: str, model: str, outcome: Outcome) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"kvagent-{outcome.stats['session']}",
        "choices": [
            {
                "index": 0,
                "text": outcome.decoded.text,
                "logprobs": None,
                "finish_reason": FINISH[outcome.decoded.finish_reason],
            }
        ],  # fmt: skip
        "usage": outcome.usage,
        "kvagent": outcome.stats,
    }


class Chunks:
    """The stream of one reply: content deltas as its text grows (with tools offered, only the
    text before a tool call can be shown early), then the rest, tool calls and the finish reason.
    The deltas add up to the non-streamed content."""

    def __init__(self, endpoint: str, model: str, tools_on: bool, include_usage: bool) -> None:
        self.endpoint, self.model = endpoint, model
        self.tools_on, self.include_usage = tools_on, include_usage
        self.id = new_id("chatcmpl" if endpoint == "chat" else "cmpl")
        self.created = int(time.time())
        self.sent = ""

    def _chunk(self, delta: dict[str, Any] | str | None, finish: str | None = None, **extra: Any) -> str:
        if self.endpoint == "chat":
            choice = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        body = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        return sse({**body, **extra})

    def _text(self, text: str) -> str | None:
        if not text:
            return None
        self.sent += text
        return self._chunk({"content": text} if self.endpoint == "chat" else text)

    def first(self) -> str | None:
        return self._chunk({"role": "assistant", "content": ""}) if self.endpoint == "chat" else None

    def grow(self, visible: str) -> str | None:
        shown = toolcalls.safe_prefix(visible) if self.tools_on else visible
        if len(shown) <= len(self.sent) or not shown.startswith(self.sent):
            return None
        return self._text(shown[len(self.sent) :])

    def end(self, outcome: Outcome) -> list[str]:
        content, calls = _message(outcome.decoded.text, self.tools_on)
        out = []
        content = content or ""
        if content.startswith(self.sent):
            out.append(self._text(content[len(self.sent) :]))
        if calls:
            deltas = [{"index": i, **c} for i, c in enumerate(calls)]
            out.append(self._chunk({"tool_calls": deltas}))
        out.append(self._chunk(None, _finish_reason(outcome, calls), kvagent=outcome.stats))
        if self.include_usage:
            out.append(
                sse({"id": self.id, "object": "chat.completion.chunk" if self.endpoint == "chat" else
                     "text_completion", "created": self.created, "model": self.model, "choices": [],
                     "usage": outcome.usage})
            )  # fmt: skip
        return [c for c in out if c]
