"""Parse the one function call of a model reply (`<function=NAME>` ... `</function>`).

A reply whose call cannot be used raises `ToolCallError`; its message is the observation sent back to
the model, and the episode goes on (the model gets to correct itself, as in R2E-Gym)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kvagent.agent.tools import TOOLS, ToolSpec

CALL_END = "</function>"
CALL_START = "<function="
_HEADER = re.compile(r"<function=\s*([A-Za-z_][\w.-]*)\s*>")
_PARAM = re.compile(r"(?s)<parameter=\s*([^>\s]+)\s*>(.*?)</parameter>")
CALL_FORMAT = "<function=NAME>\n<parameter=KEY>value</parameter>\n...\n</function>"


class ToolCallError(ValueError):
    """The reply holds no usable call; `str(error)` is the observation for the model."""

    def __init__(self, problem: str, tools: tuple[ToolSpec, ...] = TOOLS) -> None:
        self.problem = problem
        names = ", ".join(t.name for t in tools)
        super().__init__(
            f"ERROR: {problem}\n"
            "You must call exactly one function in every reply, in this format:\n"
            f"{CALL_FORMAT}\n"
            f"Available functions: {names}."
        )


@dataclass(frozen=True)
class ToolCall:
    name: str
    params: dict[str, str] = field(default_factory=dict)
    text: str = ""  # the call block as the model wrote it


def parse_call(reply: str, tools: tuple[ToolSpec, ...] = TOOLS) -> ToolCall:
    """The first complete call block of `reply`, validated against `tools`.

    Same as taking the first `(?s)<function=.*?</function>` match, except that a stray `<function=`
    mention before the real call (e.g. inside `<think>`) does not swallow it: the block starts at the
    last `<function=` before the first `</function>`."""
    end = reply.find(CALL_END)
    if end < 0:
        if CALL_START in reply:
            raise ToolCallError(f"the function call is not closed with {CALL_END}.", tools)
        raise ToolCallError("your reply contains no function call.", tools)
    start = reply.rfind(CALL_START, 0, end)
    if start < 0:
        raise ToolCallError(f"found {CALL_END} without an opening <function=NAME>.", tools)
    block = reply[start : end + len(CALL_END)]
    header = _HEADER.match(block)
    if header is None:
        raise ToolCallError("malformed function header; write it as <function=NAME> on its own line.", tools)
    name = header.group(1)
    body = block[header.end() : -len(CALL_END)]
    params: dict[str, str] = {}
    for m in _PARAM.finditer(body):
        key = m.group(1)
        if key in params:
            raise ToolCallError(f"parameter {key!r} is given twice in the call to {name!r}.", tools)
        params[key] = m.group(2).strip()
    leftover = _PARAM.sub("", body)
    if "<parameter" in leftover or "</parameter>" in leftover:
        raise ToolCallError("malformed parameter; write each one as <parameter=KEY>value</parameter>.", tools)
    return ToolCall(name=name, params=_validated(name, params, tools), text=block)


def _validated(name: str, params: dict[str, str], tools: tuple[ToolSpec, ...]) -> dict[str, str]:
    spec = next((t for t in tools if t.name == name), None)
    if spec is None:
        raise ToolCallError(f"unknown function {name!r}.", tools)
    unknown = [k for k in params if spec.param(k) is None]
    if unknown:
        raise ToolCallError(
            f"function {name!r} has no parameter {unknown[0]!r}; its parameters are "
            f"{', '.join(spec.param_names)}.",
            tools,
        )
    missing = [k for k in spec.required if not params.get(k)]
    if missing:
        raise ToolCallError(f"function {name!r} is missing its required parameter {missing[0]!r}.", tools)
    for p in spec.params:
        if p.choices and p.name in params and params[p.name] not in p.choices:
            raise ToolCallError(
                f"parameter {p.name!r} of {name!r} must be one of {', '.join(p.choices)}; "
                f"got {params[p.name]!r}.",
                tools,
            )
        if p.default is not None and p.name not in params:
            params[p.name] = p.default
    return params
