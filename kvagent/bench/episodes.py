"""Episode sources for replay: a kvagent trajectory JSON, normalised JSONL of other scaffolds' messages,
or a generated episode (scripted tool calls against a real repository in a sandbox).

An `Episode` is a list of messages (`role`, `content`; function calls already rendered into the
assistant text) plus an optional planted-fact `Probe` asked at the end."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvagent.errors import ConfigError, KvagentError
from kvagent.fileio import read_jsonl

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Probe:
    """A fact stated once early in the episode, asked for at the very end."""

    question: str  # user turn appended after the episode
    answer_prefix: str  # assistant text teacher-forced before the value
    value: str  # what must be retrieved, e.g. "7319-AXQ"


@dataclass
class Episode:
    name: str
    messages: list[dict[str, str]]
    probe: Probe | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    extra_probes: tuple[Probe, ...] = ()  # more planted facts (the segments study's fact in a reply)


DEFAULT_FACT = ("the deploy key is", "7319-AXQ")


def default_probe(value: str = DEFAULT_FACT[1]) -> Probe:
    return Probe(
        question="Before you finish: what is the deploy key that was mentioned earlier in this session? "
        "Reply with the key only.",
        answer_prefix="The deploy key is",
        value=value,
    )


# ----------------------------------------------------------------------- tool-call rendering
def _call_name_args(call: dict[str, Any]) -> tuple[str, str]:
    # Both the documented {name, arguments} shape and the OpenAI {function: {name, arguments}} shape.
    fn = call.get("function") if isinstance(call.get("function"), dict) else call
    name = fn.get("name")
    if not name:
        raise KvagentError(f"tool call without a name: {json.dumps(call)[:120]}")
    return str(name), fn.get("arguments") or "{}"


def render_tool_call(call: dict[str, Any]) -> str:
    """One call in the R2E format: `<function=NAME>`, one `<parameter=K>V</parameter>` per argument."""
    name, raw = _call_name_args(call)
    try:
        args = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        args = None
    lines = [f"<function={name}>"]
    if isinstance(args, dict):
        for k, v in args.items():
            value = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
            lines.append(f"<parameter={k}>{value}</parameter>")
    else:
        # Arguments that are not a JSON object are kept verbatim rather than dropped.
        lines.append(f"<parameter=arguments>{raw}</parameter>")
    lines.append("</function>")
    return "\n".join(lines)


def normalise_message(m: dict[str, Any]) -> dict[str, str]:
    role = m.get("role")
    if role not in ROLES:
        raise KvagentError(f"message role {role!r} is not one of {', '.join(ROLES)}")
    content = m.get("content") or ""
    if isinstance(content, list):  # multi-part content: keep the text parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    calls = m.get("tool_calls") or []
    if role == "assistant" and calls:
        rendered = "\n".join(render_tool_call(c) for c in calls)
        content = f"{content.rstrip()}\n\n{rendered}" if content.strip() else rendered
    return {"role": role, "content": str(content)}


# ----------------------------------------------------------------------- planting a fact
def plant_fact(messages: list[dict[str, str]], value: str = DEFAULT_FACT[1]) -> list[dict[str, str]]:
    """Append the fact to the first observation after the first assistant turn (once, early)."""
    out = [dict(m) for m in messages]
    seen_assistant = False
    for m in out:
        if m["role"] == "assistant":
            seen_assistant = True
        elif seen_assistant and m["role"] in ("user", "tool"):
            m["content"] = f"{m['content'].rstrip()}\nNote from the maintainers: {DEFAULT_FACT[0]} {value}.\n"
            return out
    raise KvagentError("cannot plant the probe fact: the episode has no observation after an assistant turn")


# ----------------------------------------------------------------------- sources
def from_messages(name: str, messages: list[dict[str, Any]], plant: bool = True, meta=None) -> Episode:
    msgs = [normalise_message(m) for m in messages]
    if not any(m["role"] == "assistant" for m in msgs):
        raise KvagentError(f"episode {name}: no assistant message to score")
    probe = None
    if plant:
        msgs = plant_fact(msgs)
        probe = default_probe()
    return Episode(name=name, messages=msgs, probe=probe, meta=dict(meta or {}))


def load_json_episode(path: Path, plant: bool = True, data: dict[str, Any] | None = None) -> Episode:
    """A kvagent trajectory (`format: kvagent.trajectory/1`) or any `{"messages": [...]}` JSON
    (`data`: the file, already read)."""
    from kvagent.agent.trajectory import load_trajectory

    data = load_trajectory(path, any_format=True) if data is None else data
    name = path.name.removesuffix(".json").removesuffix(".traj")
    return from_messages(name, data["messages"], plant=plant, meta={"source": str(path)})


def load_jsonl_episodes(
    path: Path, first: int | None = None, ids: set[str] | None = None, plant: bool = True
):
    """Normalised message records, one per line (`id`, `messages`, tool calls in `tool_calls`)."""
    if not path.is_file():
        raise ConfigError(f"episodes: {path} does not exist")
    out: list[Episode] = []
    for lineno, rec in read_jsonl(path):
        rid = str(rec.get("id", f"{path.stem}-{lineno}"))
        if ids and rid not in ids:
            continue
        meta = {"source": f"{path}:{lineno}"}
        out.append(from_messages(rid, rec.get("messages") or [], plant=plant, meta=meta))
        if first is not None and len(out) >= first:
            break
    if not out:
        raise ConfigError(f"episodes: no matching records in {path}")
    return out


def truncate_messages(messages: list[dict[str, str]], max_chars: int) -> list[dict[str, str]]:
    """Keep whole messages while the running text stays under `max_chars` (at least through the
    first assistant turn and its observation, so the planted fact survives)."""
    out, total, assistants = [], 0, 0
    for m in messages:
        total += len(m["content"])
        if total > max_chars and assistants >= 1 and out and out[-1]["role"] != "assistant":
            break
        out.append(m)
        assistants += m["role"] == "assistant"
    return out
