"""The request bodies of /v1/chat/completions and /v1/completions, checked field by field into one
`GenRequest`. Every refusal is a `RequestError` naming the field: an unknown field, a wrong type, a
value out of range, or an OpenAI feature this server does not have (n > 1, logprobs, penalties).
Fields sent at their no-op value (n=1, logprobs=false, presence_penalty=0) are accepted, so clients
that spell out defaults work unchanged."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvagent.serve.errors import RequestError
from kvagent.serve.kvconfig import kv_fields
from kvagent.serve.messages import check_messages, check_tools


@dataclass
class GenRequest:
    """One generation request, as both endpoints have it after checking."""

    endpoint: str  # "chat" | "completions"
    model: str
    messages: list[dict[str, Any]] | None = None  # chat
    prompt: str | list[int] | None = None  # completions: text or token ids
    tools: list[dict[str, Any]] | None = None
    tool_choice: str = "auto"
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None  # None: up to the context limit
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_tokens: int = 0
    ignore_eos: bool = False
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = False
    stream: bool = False
    include_usage: bool = False
    kv: dict[str, Any] = field(default_factory=dict)  # the kv_* fields given
    require_session: bool = False  # kv_require_session: a 409 rather than re-prefilling a lost session
    mask_keep: int | None = None  # kv_history's M: tool outputs but the newest M masked (app.py)


def _loads(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise RequestError("request body: empty; send a JSON object")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"request body: not valid JSON ({e}); send a JSON object") from None
    if not isinstance(body, dict):
        raise RequestError(f"request body: a JSON {type(body).__name__}, not an object; send a JSON object")
    return body


# ----------------------------------------------------------------------------- value checks
def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(name: str, lo: int | None = None, hi: int | None = None) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if not _is_int(v):
            raise RequestError(f"{name}: expected an integer, got {json.dumps(v)}", param=name)
        if lo is not None and v < lo:
            raise RequestError(f"{name}: must be >= {lo}, got {v}", param=name)
        if hi is not None and v > hi:
            raise RequestError(f"{name}: must be <= {hi}, got {v}", param=name)
        return v

    return check


def _number(name: str, lo: float, hi: float, lo_open: bool = False) -> Callable[[Any], float]:
    def check(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise RequestError(f"{name}: expected a number, got {json.dumps(v)}", param=name)
        if v < lo or (lo_open and v == lo) or v > hi:
            span = f"{'(' if lo_open else '['}{lo}, {hi}]"
            raise RequestError(f"{name}: must be in {span}, got {v}", param=name)
        return float(v)

    return check


def _bool(name: str) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        if not isinstance(v, bool):
            raise RequestError(f"{name}: expected true or false, got {json.dumps(v)}", param=name)
        return v

    return check


def _only(name: str, *allowed: Any, why: str) -> Callable[[Any], None]:
    """A field this server accepts only at its no-op value(s)."""

    def check(v: Any) -> None:
        if v is not None and not any(v == a and type(v) is type(a) for a in allowed):
            raise RequestError(f"{name}: {json.dumps(v)} is not supported ({why})", param=name)

    return check


def _stop(v: Any) -> list[str]:
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise RequestError(f"stop: expected a string or a list of strings, got {json.dumps(v)}", param="stop")
    if any(not s for s in items):
        raise RequestError("stop: an empty stop string would end every reply at once; drop it", param="stop")
    return items


def _token_ids(name: str) -> Callable[[Any], list[int]]:
    def check(v: Any) -> list[int]:
        if not isinstance(v, list) or not all(_is_int(t) and t >= 0 for t in v):
            raise RequestError(f"{name}: expected a list of token ids (ints >= 0)", param=name)
        return v

    return check


def _top_k(v: Any) -> int:
    k = _int("top_k", lo=-1)(v)
    return 0 if k == -1 else k  # vLLM spells "off" -1; kvagent's Sampling spells it 0


def _stream_options(v: Any) -> bool:
    if not isinstance(v, dict) or set(v) - {"include_usage", "continuous_usage_stats"}:
        raise RequestError('stream_options: expected {"include_usage": true|false}', param="stream_options")
    return _bool("stream_options.include_usage")(v.get("include_usage", False))


def _object(name: str) -> Callable[[Any], dict[str, Any]]:
    def check(v: Any) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise RequestError(f"{name}: expected a JSON object, got {json.dumps(v)}", param=name)
        return v

    return check


def _response_format(v: Any) -> None:
    if not (isinstance(v, dict) and v.get("type") == "text"):
        raise RequestError(
            'response_format: only {"type": "text"} is supported (no JSON mode or schemas)',
            param="response_format",
        )


# Fields both endpoints share: name -> (GenRequest attribute or None to only check, checker).
COMMON: dict[str, tuple[str | None, Callable[[Any], Any]]] = {
    "temperature": ("temperature", _number("temperature", 0.0, 100.0)),
    "top_p": ("top_p", _number("top_p", 0.0, 1.0, lo_open=True)),
    "top_k": ("top_k", _top_k),
    "min_tokens": ("min_tokens", _int("min_tokens", lo=0)),
    "ignore_eos": ("ignore_eos", _bool("ignore_eos")),
    "seed": ("seed", _int("seed", lo=-(2**63), hi=2**64 - 1)),
    "stop": ("stop", _stop),
    "stop_token_ids": ("stop_token_ids", _token_ids("stop_token_ids")),
    "include_stop_str_in_output": ("include_stop_str_in_output", _bool("include_stop_str_in_output")),
    "skip_special_tokens": ("skip_special_tokens", _bool("skip_special_tokens")),
    "stream": ("stream", _bool("stream")),
    "kv_require_session": ("require_session", _bool("kv_require_session")),
    "stream_options": ("include_usage", _stream_options),
    "n": (None, _only("n", 1, why="one choice per request; send n requests")),
    "best_of": (None, _only("best_of", 1, why="one choice per request")),
    "presence_penalty": (None, _only("presence_penalty", 0, 0.0, why="no penalties")),
    "frequency_penalty": (None, _only("frequency_penalty", 0, 0.0, why="no penalties")),
    "repetition_penalty": (None, _only("repetition_penalty", 1, 1.0, why="no penalties")),
    "logit_bias": (None, _only("logit_bias", {}, why="no logit bias")),
    "user": (None, lambda v: None),
}


def _kv_history(v: Any) -> int | None:
    """kv_history: keep | mask-observations[=M] (agent/history.py): M, or None to keep every one."""
    from kvagent.agent.history import parse_history
    from kvagent.errors import ConfigError

    if v == "keep":
        return None
    try:
        rules = parse_history(v) if isinstance(v, str) else None
    except ConfigError:
        rules = None
    if rules is None or rules.keep is None or rules.reply != "keep-thinking":
        raise RequestError(
            f"kv_history: expected keep or mask-observations[=M], got {json.dumps(v)}", param="kv_history"
        )
    return rules.keep


CHAT_ONLY: dict[str, tuple[str | None, Callable[[Any], Any]]] = {
    "max_tokens": ("max_tokens", _int("max_tokens", lo=1)),
    "max_completion_tokens": ("max_tokens", _int("max_completion_tokens", lo=1)),
    "logprobs": (None, _only("logprobs", False, why="no log-probabilities")),
    "top_logprobs": (None, _only("top_logprobs", 0, why="no log-probabilities")),
    "parallel_tool_calls": (None, _bool("parallel_tool_calls")),
    "response_format": (None, _response_format),
    "chat_template_kwargs": ("chat_template_kwargs", _object("chat_template_kwargs")),
    "kv_history": (None, _kv_history),  # observation masking: parse_chat keeps M, app.py applies it
}
COMPLETIONS_ONLY: dict[str, tuple[str | None, Callable[[Any], Any]]] = {
    "max_tokens": ("max_tokens", _int("max_tokens", lo=1)),
    "echo": (None, _only("echo", False, why="the prompt is not echoed")),
    "logprobs": (None, _only("logprobs", 0, why="no log-probabilities")),
    "suffix": (None, _only("suffix", "", why="no insertion mode")),
}


def _apply(body: dict[str, Any], req: GenRequest, table: dict[str, tuple[str | None, Callable]]) -> None:
    for name, (attr, check) in table.items():
        if name not in body or body[name] is None:
            continue
        value = check(body[name])
        if attr is not None:
            setattr(req, attr, value)


def _unknown(body: dict[str, Any], known: set[str]) -> None:
    extra = sorted(set(body) - known)
    if extra:
        raise RequestError(
            f"{extra[0]}: unsupported field; remove it (this server takes {', '.join(sorted(known))})",
            param=extra[0],
        )


def _model(body: dict[str, Any]) -> str:
    m = body.get("model")
    if not isinstance(m, str) or not m:
        raise RequestError(
            "model: missing or not a string; send the name GET /v1/models lists", param="model"
        )
    return m


def _finish(req: GenRequest, body: dict[str, Any]) -> GenRequest:
    if "stream_options" in body and body["stream_options"] is not None and not req.stream:
        raise RequestError("stream_options: only with stream=true", param="stream_options")
    if req.seed is not None and req.seed < 0:
        req.seed %= 2**64  # torch seeds are unsigned
    req.kv = {k: body[k] for k in kv_fields() if body.get(k) is not None}
    return req


def parse_chat(raw: bytes) -> GenRequest:
    body = _loads(raw)
    _unknown(body, {"model", "messages", "tools", "tool_choice", *COMMON, *CHAT_ONLY, *kv_fields()})
    req = GenRequest(endpoint="chat", model=_model(body))
    if "messages" not in body:
        raise RequestError("messages: missing; send a list of {role, content} messages", param="messages")
    req.messages = check_messages(body["messages"])
    _apply(body, req, COMMON)
    _apply(body, req, CHAT_ONLY)
    if body.get("kv_history") is not None:
        req.mask_keep = _kv_history(body["kv_history"])
    if body.get("tools") is not None:
        req.tools = check_tools(body["tools"])
    choice = body.get("tool_choice")
    if choice is not None:
        if choice not in ("auto", "none"):
            raise RequestError(
                f'tool_choice: {json.dumps(choice)} is not supported; use "auto" or "none"',
                param="tool_choice",
            )
        req.tool_choice = choice
    return _finish(req, body)


def parse_completion(raw: bytes) -> GenRequest:
    body = _loads(raw)
    _unknown(body, {"model", "prompt", *COMMON, *COMPLETIONS_ONLY, *kv_fields()})
    req = GenRequest(endpoint="completions", model=_model(body), max_tokens=16)  # OpenAI's default
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("prompt: empty; send some text or token ids", param="prompt")
    elif isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        pass
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise RequestError(
            "prompt: one prompt per request; send a batch as separate requests", param="prompt"
        )
    else:
        raise RequestError("prompt: expected a non-empty string or list of token ids", param="prompt")
    req.prompt = prompt
    _apply(body, req, COMMON)
    _apply(body, req, COMPLETIONS_ONLY)
    return _finish(req, body)
