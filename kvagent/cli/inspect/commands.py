"""The `inspect` command's declaration. Registered by app.py; the body and terminal output are run.py,
the static page page.py, the episode as both show it view.py."""

from __future__ import annotations

from typing import Annotated

import typer

from kvagent.cli.exits import user_errors


@user_errors
def inspect(
    path: Annotated[str, typer.Argument(help="A trajectory (*.traj.json) or a directory of them.")],
    turn: Annotated[int | None, typer.Option(help="Show only this step, in full.")] = None,
    full: Annotated[bool, typer.Option("--full", help="Replies and observations untrimmed.")] = False,
    html: Annotated[
        str | None, typer.Option(help="Also write one static page (turns, calls, stats, cache plot) here.")
    ] = None,
) -> None:
    """Browse an episode: turns, tool calls, observations and per-turn cache statistics."""
    from kvagent.cli.inspect.run import run_inspect

    run_inspect(path, turn=turn, full=full, html=html)
