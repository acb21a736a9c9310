"""`kvagent inspect --html`: one self-contained static page per call (no scripts, no external files):
each episode's header, per-turn cache statistics, a plot of cache occupancy and evictions over the
episode (matplotlib PNG, base64-embedded), and every turn's reply, call and observation."""

from __future__ import annotations

import base64
import io
from html import escape
from pathlib import Path
from typing import Any

from kvagent.cli.inspect.view import (
    STAT_HEADERS,
    episode_turns,
    num,
    stat_cells,
    summary,
    tool_name,
    turn_rows,
)
from kvagent.fileio import atomic_write_text

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 75em; color: #222; }
h1, h2 { border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 1em 0; font-size: 90%; }
th, td { border: 1px solid #ddd; padding: 2px 8px; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
pre { background: #f7f7f7; padding: .6em; overflow-x: auto; white-space: pre-wrap; }
pre.obs { background: #f0f4f8; color: #444; }
details { margin: .4em 0; border: 1px solid #ddd; border-radius: 4px; padding: .3em .6em; }
summary { cursor: pointer; font-weight: 600; }
.stats { color: #555; font-size: 90%; } .err { color: #a40; }
"""


def cache_plot(data: dict[str, Any]) -> bytes | None:
    """PNG: tokens and cache entries per step (with K and K+r), and entries evicted per step; None when
    the trajectory has no per-turn cache statistics."""
    rows = [r for r in turn_rows(episode_turns(data)) if r["tokens"] is not None]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; must precede pyplot
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    steps = [r["step"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True, height_ratios=(2, 1))
    top.plot(steps, [r["tokens"] for r in rows], marker=".", label="tokens (logical length)")
    if any(r["entries"] is not None for r in rows):
        entries = [r["entries"] if r["entries"] is not None else float("nan") for r in rows]
        top.plot(steps, entries, marker=".", label="cache entries (largest layer)")
    c = (data.get("meta") or {}).get("cache_config") or {}
    if c.get("policy") not in (None, "full") and isinstance(c.get("budget"), int):
        top.axhline(c["budget"], color="grey", linestyle="--", linewidth=1, label=f"K = {c['budget']}")
        top.axhline(
            c["budget"] + (c.get("buffer") or 0), color="grey", linestyle=":", linewidth=1, label="K + r"
        )
    top.set_ylabel("tokens")
    top.set_ylim(bottom=0)
    top.legend(loc="upper left", fontsize=8)
    top.grid(alpha=0.3)
    bottom.bar(steps, [r["new_evicted"] or 0 for r in rows], color="tab:red", alpha=0.7)
    bottom.set_ylabel("entries evicted")
    bottom.set_xlabel("step")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def stats_html(rows: list[dict[str, Any]]) -> str:
    out = [
        "<table><tr>",
        *(f'<th class="{"l" if h == "tool" else ""}">{h}</th>' for h in STAT_HEADERS),
        "</tr>",
    ]
    for r in rows:
        cells = stat_cells(r)
        out.append("<tr>" + "".join(
            f'<td class="{"l" if i == 1 else ""}">{escape(str(c))}</td>' for i, c in enumerate(cells)) + "</tr>")  # fmt: skip
    out.append("</table>")
    return "".join(out)


def turn_html(turn: dict[str, Any], row: dict[str, Any]) -> str:
    stats = f"tokens {num(row['tokens'])} | cache {num(row['entries'])}"
    if row["rounds"] is not None:
        stats += f" | rounds {row['rounds']:,} (+{row['new_rounds']}) | evicted {row['evicted']:,} (+{row['new_evicted']:,})"
    parts = [
        f"<details><summary>step {escape(str(turn.get('step')))}: {escape(tool_name(turn))}</summary>",
        f'<div class="stats">{escape(stats)}</div>',
        f"<pre>{escape(turn.get('reply') or '(empty reply)')}</pre>",
    ]
    call = turn.get("call")
    if call:
        params = "".join(
            f"<tr><td class='l'>{escape(str(k))}</td><td class='l'><pre>{escape(str(v))}</pre></td></tr>"
            for k, v in (call.get("params") or {}).items()
        )
        parts.append(f"<div>call <b>{escape(str(call.get('name')))}</b></div><table>{params}</table>")
    elif turn.get("call_error"):
        parts.append(f'<div class="err">no valid call: {escape(str(turn["call_error"]))}</div>')
    if turn.get("observation") is not None:
        parts.append(f'<div>observation</div><pre class="obs">{escape(turn["observation"])}</pre>')
    parts.append("</details>")
    return "\n".join(parts)


def episode_html(path: Path, data: dict[str, Any]) -> str:
    turns = episode_turns(data)
    rows = turn_rows(turns)
    head = "".join(
        f"<tr><th class='l'>{escape(k)}</th><td class='l'>{escape(v)}</td></tr>"
        for k, v in summary(path, data).items()
    )
    parts = [f"<h2>{escape(path.name)}</h2>", f"<table>{head}</table>"]
    png = cache_plot(data)
    if png is not None:
        b64 = base64.b64encode(png).decode("ascii")
        parts.append(f'<img alt="cache occupancy and evictions per step" src="data:image/png;base64,{b64}">')
        parts.append(stats_html(rows))
    else:
        parts.append("<p>(no per-turn cache statistics in this file)</p>")
    parts += [turn_html(t, r) for t, r in zip(turns, rows, strict=True)]
    if data.get("patch"):
        parts.append(f"<details><summary>patch</summary><pre>{escape(data['patch'])}</pre></details>")
    return "\n".join(parts)


def write_html(target: str | Path, episodes: list[tuple[Path, dict[str, Any]]]) -> Path:
    title = episodes[0][0].name if len(episodes) == 1 else f"{len(episodes)} episodes"
    body = "\n".join(episode_html(p, d) for p, d in episodes)
    page = (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>kvagent inspect: {escape(title)}</title>'
        f"<style>{STYLE}</style></head>\n<body><h1>kvagent inspect: {escape(title)}</h1>\n{body}\n</body></html>\n"
    )
    target = Path(target).expanduser()
    atomic_write_text(target, page)
    return target
