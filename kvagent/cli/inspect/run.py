"""`kvagent inspect`: an episode's turns, tool calls, observations and per-turn cache statistics in the
terminal (a directory: one row per episode); `--html` writes the same as one static page with a plot
of the cache over the episode (kvagent.cli.inspect.page)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kvagent.cli.inspect.view import (
    STAT_HEADERS,
    episode_turns,
    load_episodes,
    num,
    stat_cells,
    summary,
    tool_name,
    turn_rows,
)
from kvagent.cli.ui import trim_lines
from kvagent.errors import KvagentError

SHOWN_LINES = 30  # reply / observation lines shown per turn unless --full or --turn


# ----------------------------------------------------------------------------- the terminal
def header_panel(path: Path, data: dict[str, Any]) -> Panel:
    grid = Table.grid(padding=(0, 2))
    for key, value in summary(path, data).items():
        grid.add_row(Text(key, style="bold"), Text(value))
    return Panel(grid, title="episode", title_align="left", border_style="blue")


def stats_table(turns: list[dict[str, Any]]) -> Table:
    table = Table(title="per-turn cache statistics", title_justify="left")
    for col in STAT_HEADERS:
        table.add_column(col, justify="left" if col == "tool" else "right", no_wrap=col == "tool")
    for r in turn_rows(turns):
        table.add_row(*stat_cells(r))
    return table


def turn_panel(turn: dict[str, Any], row: dict[str, Any], shown: int | None) -> Panel:
    def cut(text: str) -> str:
        return text if shown is None else trim_lines(text, shown)

    parts: list[Any] = [Text(cut(turn.get("reply") or "(empty reply)"))]
    call = turn.get("call")
    if call:
        line = Text("call ", style="bold cyan")
        line.append(str(call.get("name")), style="bold")
        for key, value in (call.get("params") or {}).items():
            first = str(value).split("\n", 1)[0]
            line.append(f"  {key}=", style="cyan")
            line.append(first[:80] + ("…" if len(first) > 80 or "\n" in str(value) else ""))
        parts.append(line)
    elif turn.get("call_error"):
        parts.append(Text(f"no valid call: {turn['call_error']}", style="yellow"))
    if turn.get("observation") is not None:
        parts.append(Text("observation", style="bold"))
        parts.append(Text(cut(turn["observation"]), style="dim"))
    stats = [f"tokens {num(row['tokens'])}", f"cache {num(row['entries'])}"]
    if row["rounds"] is not None:
        stats += [
            f"rounds {row['rounds']:,} (+{row['new_rounds']})",
            f"evicted {row['evicted']:,} (+{row['new_evicted']:,})",
        ]
    if turn.get("finish_reason"):
        stats.append(f"finish {turn['finish_reason']}")
    return Panel(
        Group(*parts),
        title=f"step {turn.get('step')}: {tool_name(turn)}",
        title_align="left",
        subtitle=" | ".join(stats),
        subtitle_align="left",
        border_style="cyan",
    )


def show_episode(
    console: Console, path: Path, data: dict[str, Any], turn: int | None = None, full: bool = False
) -> None:
    turns = episode_turns(data)
    rows = turn_rows(turns)
    if turn is not None:
        picked = [i for i, t in enumerate(turns) if t.get("step") == turn]
        if not picked:
            raise KvagentError(f"turn: {path} has steps 1..{len(turns)}, not {turn}; pick one of those")
        console.print(turn_panel(turns[picked[0]], rows[picked[0]], None))
        return
    console.print(header_panel(path, data))
    if any(r["tokens"] is not None for r in rows):
        console.print(stats_table(turns))
    for t, r in zip(turns, rows, strict=True):
        console.print(turn_panel(t, r, None if full else SHOWN_LINES))
    patch = data.get("patch") or ""
    if patch:
        from rich.syntax import Syntax

        shown = patch if full else trim_lines(patch, 2 * SHOWN_LINES)
        console.print(Panel(Syntax(shown, "diff", theme="ansi_dark", background_color="default"), title="patch",
                            title_align="left", border_style="green"))  # fmt: skip


def index_table(episodes: list[tuple[Path, dict[str, Any]]], root: Path) -> Table:
    table = Table(title=f"{len(episodes)} episodes under {root}", title_justify="left")
    for col in ("file", "exit status", "steps", "tokens", "cache", "rounds", "evicted", "patch"):
        table.add_column(col, justify="left" if col in ("file", "exit status", "patch") else "right")
    for path, data in episodes:
        rows = turn_rows(episode_turns(data))
        last = rows[-1] if rows else {"entries": None, "rounds": None, "evicted": None}
        s = summary(path, data)
        table.add_row(
            str(path.relative_to(root)), s["exit status"], s["steps"], num(data.get("logical_length")),
            num(last["entries"]), num(last["rounds"]), num(last["evicted"]), s["patch"],
        )  # fmt: skip
    return table


def run_inspect(
    path: str,
    *,
    turn: int | None = None,
    full: bool = False,
    html: str | None = None,
    console: Console | None = None,
) -> list[tuple[Path, dict[str, Any]]]:
    if html:
        from kvagent.cli.common import check_out_file

        check_out_file(html, "html")  # before the episode is shown, not after
    episodes = load_episodes(path)
    console = console or Console()
    if len(episodes) == 1:
        show_episode(console, *episodes[0], turn=turn, full=full)
    elif turn is not None:
        raise KvagentError(f"turn: {path} holds {len(episodes)} trajectories; pass one file with --turn")
    else:
        console.print(index_table(episodes, Path(path).expanduser()))
        console.print(Text("kvagent inspect FILE shows one episode's turns", style="dim"))
    if html:
        from kvagent.cli.inspect.page import write_html

        target = write_html(html, episodes)
        console.print(f"html: {target}")
    return episodes
