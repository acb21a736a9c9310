"""An episode as `kvagent inspect` shows it (terminal and HTML alike): the trajectories under a path,
their turns (kvagent's own, or rebuilt from another scaffold's messages), per-turn cache numbers and
a header summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvagent.agent.trajectory import SUFFIX, iter_trajectories, load_trajectory
from kvagent.errors import KvagentError


def load_episodes(path: str | Path) -> list[tuple[Path, dict[str, Any]]]:
    """(path, trajectory) of one file, or of every trajectory under a directory."""
    path = Path(path).expanduser()
    if path.is_dir():
        found = list(iter_trajectories(path, any_format=True))
        if not found:
            raise KvagentError(f"{path} holds no *{SUFFIX} files; pass a trajectory or a run directory")
        return found
    return [(path, load_trajectory(path, any_format=True))]


def episode_turns(data: dict[str, Any]) -> list[dict[str, Any]]:
    """kvagent's recorded turns; for another scaffold's file (messages only), turns rebuilt from its
    messages: each assistant message and what the environment said after it, without cache stats."""
    if isinstance(data.get("turns"), list):
        return data["turns"]
    turns: list[dict[str, Any]] = []
    for m in data["messages"]:
        content = m.get("content") if isinstance(m.get("content"), str) else str(m.get("content") or "")
        if m.get("role") == "assistant":
            calls = m.get("tool_calls") or []
            call = {"name": calls[0].get("name"), "params": {}} if calls else None
            turns.append({"step": len(turns) + 1, "reply": content, "call": call})
        elif turns and m.get("role") in ("user", "tool"):
            prev = turns[-1].get("observation")
            turns[-1]["observation"] = content if prev is None else f"{prev}\n{content}"
    return turns


def turn_rows(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-turn numbers: the cumulative cache counters of each turn and what changed in it."""
    rows, rounds, evicted = [], 0, 0
    for t in turns:
        cache = t.get("cache") or {}
        now_rounds, now_evicted = cache.get("rounds", rounds), cache.get("evicted", evicted)
        rows.append(
            {
                "step": t.get("step"),
                "tool": tool_name(t),
                "reply_tokens": t.get("reply_tokens"),
                "observation_tokens": t.get("observation_tokens"),
                "tokens": t.get("logical_length"),
                "entries": t.get("cache_entries"),
                "rounds": cache.get("rounds"),
                "new_rounds": now_rounds - rounds if cache else None,
                "evicted": cache.get("evicted"),
                "new_evicted": now_evicted - evicted if cache else None,
                "kv_bytes": cache.get("total_kv_bytes"),
                "generate_s": t.get("generate_s"),
                "tool_s": t.get("tool_s"),
            }
        )
        rounds, evicted = now_rounds, now_evicted
    return rows


STAT_HEADERS = ("step", "tool", "reply tok", "obs tok", "tokens", "cache", "rounds", "evicted", "KV",
                "gen s", "tool s")  # fmt: skip


def stat_cells(row: dict[str, Any]) -> list[str]:
    """One `turn_rows` row as the cells under STAT_HEADERS (terminal table and HTML page alike)."""
    from kvagent.cli.ui import human_bytes

    return [
        num(row["step"]), row["tool"], num(row["reply_tokens"]), num(row["observation_tokens"]),
        num(row["tokens"]), num(row["entries"]), num(row["rounds"]), num(row["evicted"]),
        "-" if row["kv_bytes"] is None else human_bytes(row["kv_bytes"]),
        num(row["generate_s"], ".1f"), num(row["tool_s"], ".1f"),
    ]  # fmt: skip


def tool_name(turn: dict[str, Any]) -> str:
    if turn.get("call"):
        return str(turn["call"].get("name"))
    if turn.get("call_error"):
        return "(no valid call)"
    return "-"


def cache_label(data: dict[str, Any]) -> str:
    c = (data.get("meta") or {}).get("cache_config") or {}
    if not c:
        return "-"
    if c.get("policy") == "full" or c.get("budget") is None:
        return f"full cache, {c.get('mode', '?')}"
    return f"{c.get('policy')} K={c.get('budget')} r={c.get('buffer')} {c.get('mode')} protect={c.get('protect')}"


def summary(path: Path, data: dict[str, Any]) -> dict[str, str]:
    """The episode's header, as label -> text."""
    meta = data.get("meta") or {}
    patch = data.get("patch") or ""
    added = sum(1 for ln in patch.splitlines() if ln.startswith("+") and not ln.startswith("+++"))
    removed = sum(1 for ln in patch.splitlines() if ln.startswith("-") and not ln.startswith("---"))
    out = {
        "file": str(path),
        "instance": str(meta.get("instance_id") or data.get("instance_id") or "-"),
        "model": str(meta.get("model") or data.get("model") or "-"),
        "cache": cache_label(data),
        "exit status": str(data.get("exit_status") or "-"),
        "steps": str(data.get("steps", len(episode_turns(data)))),
        "tokens": f"{data.get('logical_length') or 0:,} (prompt {data.get('prompt_tokens') or 0:,})",
        "elapsed": f"{data.get('elapsed_s') or 0:.1f}s",
        "patch": f"+{added} -{removed} lines" if patch else "(empty)",
    }
    last = next((t["cache"] for t in reversed(episode_turns(data)) if t.get("cache")), None)
    if last and last.get("forwards"):  # how the model ran: the static decode step, or eager and why
        counts = sorted(last["forwards"].items(), key=lambda kv: -kv[1])
        out["forwards"] = ", ".join(f"{route} {n:,}" for route, n in counts)
    if data.get("error"):
        out["error"] = str(data["error"])
    return out


def num(value: Any, fmt: str = ",") -> str:
    """A count or time for a table cell; `-` when the file has none."""
    return "-" if value is None else format(value, fmt)
