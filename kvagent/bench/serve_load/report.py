"""`kvagent bench serve`'s figures from the per-turn records: per server output tokens/s, TTFT p50/p95,
wall time per episode, prompt tokens sent vs continued, errors, KV memory; ratios to the first
server; a Markdown table and a PNG (per-conversation decode rate and TTFT vs turn)."""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from kvagent.fileio import atomic_write_bytes


def _pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def _decode_rate(r: dict[str, Any]) -> float | None:
    """Tokens/s after the first one, as one conversation sees its reply stream."""
    if not r["ok"] or r["ttft_s"] is None or r["completion_tokens"] < 2:
        return None
    span = r["duration_s"] - r["ttft_s"]
    return (r["completion_tokens"] - 1) / span if span > 0 else None


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    recs = result["records"]
    ok = [r for r in recs if r["ok"]]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    by_conv: dict[str, list[dict]] = defaultdict(list)
    for r in recs:
        by_conv[r["conversation"]].append(r)
    walls = [max(r["end"] for r in rs) - min(r["start"] for r in rs) for rs in by_conv.values()]
    out_tokens = sum(r["completion_tokens"] for r in ok)
    sent = sum(r["prompt_tokens"] for r in ok)
    cached = [r["cached_tokens"] for r in ok if r["cached_tokens"] is not None]
    per_turn = []
    for t in sorted({r["turn"] for r in recs}):
        rows = [r for r in ok if r["turn"] == t]
        tt = [r["ttft_s"] for r in rows if r["ttft_s"] is not None]
        rates = [x for r in rows if (x := _decode_rate(r)) is not None]
        per_turn.append({"turn": t, "n": len(rows), "ttft_p50_s": _pct(tt, 50), "ttft_p95_s": _pct(tt, 95),
                         "decode_tok_s_p50": _pct(rates, 50)})  # fmt: skip
    wall = result.get("wall_s")
    return {
        "label": result.get("label", result["url"]), "url": result["url"], "model": result.get("model"),
        "turns": len(recs), "errors": len(recs) - len(ok), "short": sum(bool(r.get("short")) for r in ok),
        "first_error": next((r["error"] for r in recs if not r["ok"]), None),
        "output_tokens": out_tokens, "wall_s": wall,
        "output_tok_s": out_tokens / wall if wall else None,
        "ttft_p50_s": _pct(ttft, 50), "ttft_p95_s": _pct(ttft, 95), "ttft_max_s": max(ttft) if ttft else None,
        "episode_wall_mean_s": float(np.mean(walls)) if walls else None,
        "episode_wall_max_s": max(walls) if walls else None,
        "prompt_tokens_sent": sent, "prompt_tokens_continued": sum(cached) if cached else None,
        "decode_tok_s_p50": _pct([x for r in ok if (x := _decode_rate(r)) is not None], 50),
        "kv": result.get("kv", {}), "per_turn": per_turn,
    }  # fmt: skip


def same_streams(results: list[dict[str, Any]]) -> dict[str, int]:
    """Turns whose prompt_tokens every server agrees on (the same token streams), of those all answered."""
    seen: dict[tuple, set] = defaultdict(set)
    for res in results:
        for r in res["records"]:
            if r["ok"]:
                seen[(r["conversation"], r["turn"])].add(r["prompt_tokens"])
    both = [v for v in seen.values() if v]
    return {"compared": len(both), "equal": sum(len(v) == 1 for v in both)}


def report(
    results: list[dict[str, Any]], workload: dict[str, Any], settings: dict[str, Any]
) -> dict[str, Any]:
    servers = [summarize(r) for r in results]
    base = servers[0] if servers else None
    for s in servers:
        for key in ("output_tok_s", "ttft_p50_s", "ttft_p95_s"):
            a, b = s.get(key), base.get(key) if base else None
            s[f"{key}_vs_first"] = a / b if a and b else None
    return {"workload": workload, "settings": settings, "servers": servers, "streams": same_streams(results),
            "runs": results}  # fmt: skip


def _f(x: Any, spec: str = ".2f", unit: str = "") -> str:
    return "–" if x is None else f"{x:{spec}}{unit}"


def _kv_cell(kv: dict[str, Any]) -> str:
    parts = []
    if "peak_kv_usage" in kv:
        parts.append(f"peak {kv['peak_kv_usage']:.0%}")
    if "peak_kv_bytes" in kv:
        of = f" of {kv['kv_limit_bytes'] / 2**30:.2f}" if kv.get("kv_limit_bytes") else ""
        parts.append(f"{kv['peak_kv_bytes'] / 2**30:.3f}{of} GiB")
    if "kv_capacity_tokens" in kv:
        parts.append(f"of {kv['kv_capacity_tokens']} tokens")
    for key, name in (("preemptions", "preemptions"), ("dropped_sessions", "sessions dropped"),
                      ("evicted_entries", "entries evicted")):  # fmt: skip
        if key in kv:
            parts.append(f"{int(kv[key])} {name}")
    if kv.get("prefix_cache_queries"):
        parts.append(f"prefix hits {kv.get('prefix_cache_hits', 0) / kv['prefix_cache_queries']:.0%}")
    return ", ".join(parts) or "–"


def markdown(rep: dict[str, Any]) -> str:
    w, st = rep["workload"], rep["settings"]
    lines = [
        "## kvagent bench serve",
        "",
        f"{w['conversations']} conversations, {st['concurrency']} at once, {w['turns']} turns, "
        f"{w['reply_tokens']} reply tokens; first prompt {w['first_prompt_mean']:.0f} tokens on average, final "
        f"length {w['final_length_mean']:.0f} on average (max {w['final_length_max']}, "
        f"{w['final_tokens_total']} in all). Temperature {st['temperature']}.",
        "",
        "| server | output tok/s | vs first | TTFT p50 | TTFT p95 | episode wall mean / max | decode tok/s per "
        "conversation (p50) | prompt tokens sent / continued | errors | KV (from /metrics) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in rep["servers"]:
        cont = s["prompt_tokens_continued"]
        share = (
            f" ({cont / s['prompt_tokens_sent']:.0%})" if cont is not None and s["prompt_tokens_sent"] else ""
        )
        errors = f"{s['errors']}" + (f" ({s['short']} short)" if s["short"] else "")
        lines.append(
            f"| {s['label']} | {_f(s['output_tok_s'], '.1f')} | {_f(s['output_tok_s_vs_first'], '.2f', 'x')} | "
            f"{_f(s['ttft_p50_s'], '.2f', ' s')} | {_f(s['ttft_p95_s'], '.2f', ' s')} | "
            f"{_f(s['episode_wall_mean_s'], '.1f')} / {_f(s['episode_wall_max_s'], '.1f', ' s')} | "
            f"{_f(s['decode_tok_s_p50'], '.1f')} | {s['prompt_tokens_sent']} / {_f(cont, 'd')}{share} | {errors} | "
            f"{_kv_cell(s['kv'])} |"
        )
    sm = rep["streams"]
    if len(rep["servers"]) > 1:
        lines += ["", f"Same prompt token counts on every server: {sm['equal']} of {sm['compared']} turns."]
    for s in rep["servers"]:
        if s["first_error"]:
            lines += ["", f"{s['label']}: first error: {s['first_error']}"]
    return "\n".join(lines) + "\n"


def plot(rep: dict[str, Any], path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for s in rep["servers"]:
        turns = [p["turn"] + 1 for p in s["per_turn"]]
        a.plot(turns, [p["decode_tok_s_p50"] for p in s["per_turn"]], marker="o", label=s["label"])
        line = b.plot(turns, [p["ttft_p50_s"] for p in s["per_turn"]], marker="o", label=f"{s['label']} p50")
        b.plot(turns, [p["ttft_p95_s"] for p in s["per_turn"]], ls="--", color=line[0].get_color(),
               label=f"{s['label']} p95")  # fmt: skip
    a.set(xlabel="turn", ylabel="tokens/s", title="decode rate per conversation (median)")
    b.set(xlabel="turn", ylabel="seconds", title="time to first token")
    from matplotlib.ticker import MaxNLocator

    for ax in (a, b):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())
