"""A request's prompt as token ids: chat messages through the model's own chat template (tools too,
where the template takes them; Hermes-folded where it does not), completion text through the
tokenizer, completion token ids as given. Encoded as `Engine.encode` does (no added special
tokens: the template writes its own), so a served conversation is the token stream the library
would see."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from kvagent.serve.errors import RequestError
from kvagent.serve.protocol import GenRequest
from kvagent.serve.toolcalls import fold_tools

# chat_template_kwargs may not override what the server itself passes
_RESERVED = {"conversation", "messages", "tools", "add_generation_prompt", "tokenize", "return_dict"}


def template_source(tokenizer: Any) -> str:
    t = getattr(tokenizer, "chat_template", None)
    if isinstance(t, dict):  # named templates: the default one renders chats
        t = t.get("default") or next(iter(t.values()), None)
    return t or ""


def takes_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders tools and tool calls itself (Qwen2.5/Qwen3 do)."""
    src = template_source(tokenizer)
    return "tools" in src and "tool_calls" in src


def chat_text(tokenizer: Any, req: GenRequest, generation_prompt: bool = True) -> str:
    if not template_source(tokenizer):
        raise RequestError("messages: this model has no chat template; send raw text to /v1/completions")
    tools = req.tools if req.tool_choice != "none" else None
    messages = req.messages or []
    if not takes_tools(tokenizer):
        messages, tools = fold_tools(messages, tools), None
    bad = sorted(set(req.chat_template_kwargs) & _RESERVED)
    if bad:
        raise RequestError(
            f"chat_template_kwargs: {bad[0]} is set by the server; remove it", param="chat_template_kwargs"
        )
    try:
        return tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=False,
            **req.chat_template_kwargs,
        )  # fmt: skip
    except Exception as e:  # jinja's TemplateError (raise_exception), or a type the template cannot add
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise RequestError(
            f"messages: the model's chat template refused them ({first}); check roles and their order",
            param="messages",
        ) from None


@dataclass
class Prompt:
    ids: list[int]
    # Where the chat's generation prompt (`<|im_start|>assistant\n`) begins; all of a completion
    # prompt. A NEW session takes ids[:first] as its first append (never rewound, protected under
    # protect=prompt), so a client that drops the reply it got (mini-swe-agent does after a format
    # error) and adds a turn still continues the session; and the reply a later request may
    # re-render differently counts from here.
    first: int
    # kv_history on a persistent session: [start, end) of each observation's content, oldest first
    observations: list[tuple[int, int]] = field(default_factory=list)
    # the segments policy: where each message from the first reply on, and the coming reply, start
    # (the agent loop's marks: the system prompt and the issue stay the protected head)
    segments: list[int] = field(default_factory=list)


def _chat_first(tokenizer: Any, req: GenRequest, text: str, ids: list[int]) -> int:
    """Where the chat's generation prompt starts, in tokens (the whole prompt where the cut does
    not fall on a token boundary, or the template renders the turns differently without it)."""
    if not (req.messages and req.messages[-1]["role"] != "assistant"):
        return len(ids)
    try:
        head = chat_text(tokenizer, req, generation_prompt=False)
    except RequestError:
        return len(ids)
    head_ids = tokenizer.encode(head, add_special_tokens=False)
    n = len(head_ids)
    if not text.startswith(head) or not 0 < n < len(ids) or ids[:n] != head_ids:
        return len(ids)
    return n


def message_spans(req: GenRequest, text: str, offsets: list[tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """Message index -> [start, end) of its content in the rendered chat: the tokens (by their
    character `offsets` in `text`) wholly inside its text, so the framing stays outside. Each
    message's content is looked for after the previous one's (a reply quoting an output is not
    taken for it); one the template rewrote is missing."""
    starts = [a for a, _ in offsets]
    ends = [b for _, b in offsets]
    spans, cursor = {}, 0
    for i, m in enumerate(req.messages or []):
        content = m.get("content")
        at = text.find(content, cursor) if isinstance(content, str) and content else -1
        if at < 0:
            continue
        cursor = at + len(content)
        lo = bisect.bisect_left(starts, at)
        spans[i] = (lo, max(lo, bisect.bisect_right(ends, cursor)))
    return spans


def _how(field: str) -> str:
    return f"leave {field} out, or send kv_mode reprefill" if field == "kv_history" else f"leave {field} out"


def prompt_ids(tokenizer: Any, req: GenRequest, spans: str | None = None) -> Prompt:
    """`spans`: the request field that needs the messages' token spans (`message_spans`), if any:
    then the prompt has the tool outputs' spans and the segment starts."""
    if req.endpoint == "chat":
        text = chat_text(tokenizer, req)
    elif isinstance(req.prompt, str):
        text = req.prompt
    else:
        ids = list(req.prompt or [])
        vocab = len(tokenizer)
        bad = next((t for t in ids if t >= vocab), None)
        if bad is not None:
            raise RequestError(
                f"prompt: token id {bad} is outside the vocabulary (size {vocab})", param="prompt"
            )
        return Prompt(ids, len(ids))
    offsets = None
    if spans is not None and req.endpoint == "chat":  # one encode gives the ids and their offsets
        if not getattr(tokenizer, "is_fast", False):
            raise RequestError(
                f"{spans}: this model's tokenizer gives no character offsets; {_how(spans)}", param=spans
            )
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    else:
        ids = tokenizer.encode(text, add_special_tokens=False)
    if not ids:
        raise RequestError("prompt: renders to no tokens; send some text", param="prompt")
    if req.endpoint != "chat":
        return Prompt(ids, len(ids))
    prompt = Prompt(ids, _chat_first(tokenizer, req, text, ids))
    if offsets is not None:
        from kvagent.serve.history import observations

        found = message_spans(req, text, offsets)
        messages = req.messages or []
        seen = observations(messages)
        if spans == "kv_history" and any(i not in found for i in seen):
            raise RequestError(
                f"kv_history: an observation's text is not in the rendered prompt; {_how(spans)}", param=spans
            )
        prompt.observations = [found[i] for i in seen if i in found]
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        prompt.segments = [found[i][0] for i in sorted(found) if i >= first]
        if messages and messages[-1]["role"] != "assistant":
            prompt.segments.append(len(ids))  # the reply this request samples
    return prompt
