"""The `serve` command's declaration: the cache options every command shares, and the server's own
(batching, memory, queue, address, drain). Registered by app.py; the body is run.py."""

from __future__ import annotations

from typing import Annotated

import typer

from kvagent.cli.exits import user_errors
from kvagent.cli.settings import (
    AGENT_MODEL,
    FROM_OPTIONS,
    ONE_RUN,
    CacheOptions,
    EngineOptions,
    cache_options,
    engine_options,
)


@user_errors
@cache_options(ONE_RUN)
@engine_options(model=AGENT_MODEL)
def serve(
    engine: EngineOptions = FROM_OPTIONS,
    cache: CacheOptions = FROM_OPTIONS,
    max_batch: Annotated[
        int, typer.Option(help="Sessions whose forwards one batch joins (and requests run at once).")
    ] = 8,
    kv_memory: Annotated[
        float | None,
        typer.Option(
            help="GiB of KV that sessions may hold; idle ones are dropped least recently used past it."
        ),
    ] = None,
    swap_space: Annotated[
        float | None,
        typer.Option(
            help="GiB of host memory idle sessions move to, instead of being dropped, past --kv-memory or "
            "--max-sessions; moved back when their conversation returns."
        ),
    ] = None,
    session_dir: Annotated[
        str | None,
        typer.Option(
            help="Directory idle sessions move to once --swap-space is full, and where a stopping server "
            "saves every session; a server started on it continues them."
        ),
    ] = None,
    host: Annotated[
        str, typer.Option(help="Address to listen on (127.0.0.1: this machine only).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (0: any free one, printed at start).")] = 8000,
    max_queue: Annotated[int, typer.Option(help="Requests waiting beyond those running; more get 429.")] = 64,
    max_sessions: Annotated[int, typer.Option(help="Live sessions at most (idle ones dropped LRU).")] = 1024,
    drain_timeout: Annotated[
        float,
        typer.Option(help="Seconds in-flight requests get to finish at SIGTERM before they are cancelled."),
    ] = 30.0,
    served_model_name: Annotated[
        str | None, typer.Option(help="The model name clients send (default: --model).")
    ] = None,
    log_level: Annotated[
        str, typer.Option(help="uvicorn's log level: warning, info (one line a request), debug.")
    ] = "info",
) -> None:
    """OpenAI-compatible server whose conversations each keep one live, evicted cache (kvagent\\[serve])."""
    from kvagent.cli.serve.run import run_serve

    run_serve(
        engine=engine, max_batch=max_batch, kv_memory=kv_memory, host=host, port=port, max_queue=max_queue,
        max_sessions=max_sessions, drain_timeout=drain_timeout, served_model_name=served_model_name,
        log_level=log_level, swap_space=swap_space, session_dir=session_dir,
        cache=cache,
    )  # fmt: skip
