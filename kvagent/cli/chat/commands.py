"""The `chat` command's declaration: the cache, agent and engine options every command shares, and
chat's own (approval, session file). Registered by app.py; the body is run.py (with resume.py for
--session)."""

from __future__ import annotations

from typing import Annotated

import typer

from kvagent.cli.exits import user_errors
from kvagent.cli.settings import (
    AGENT,
    AGENT_MODEL,
    FROM_OPTIONS,
    ONE_RUN,
    AgentOptions,
    CacheOptions,
    EngineOptions,
    Isolation,
    agent_options,
    cache_options,
    engine_options,
)


@user_errors
@cache_options(ONE_RUN)
@agent_options(*(name for name in AGENT if name != "patch_rule"))
@engine_options(model=AGENT_MODEL)
def chat(
    repo: Annotated[
        str, typer.Option(help="Local repository (copied; never edited in place); default: this directory.")
    ] = ".",
    engine: EngineOptions = FROM_OPTIONS,
    cache: CacheOptions = FROM_OPTIONS,
    approval: Annotated[
        str, typer.Option(help="confirm: a key (y/n/q) before each tool call; yolo: run all.")
    ] = "confirm",
    agent: AgentOptions = FROM_OPTIONS,
    isolation: Isolation = "bwrap",
    session: Annotated[
        str | None,
        typer.Option(
            help="Save the chat to this file when it ends; if it exists, continue the chat saved there "
            "(its cache exactly, the agent's edits re-applied)."
        ),
    ] = None,
) -> None:
    """Interactive agent over a local repository with a bounded cache."""
    from kvagent.cli.chat.run import run_chat

    run_chat(
        repo=repo, engine=engine, approval=approval, isolation=isolation,
        cache=cache, agent=agent.fixed(seed=cache.seed), session_file=session,
    )  # fmt: skip
