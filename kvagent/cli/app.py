"""The `kvagent` command line: every command and its options, declared with the shared option set
of `settings.py` (bad input: one line, exit 2, by `exits.py`): the top-level commands here, the `images` and `bench`
groups in `app_images.py` and `app_bench.py`. Each body lives in the module of the same name."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from kvagent.cli.app_bench import bench_app
from kvagent.cli.app_eval import eval_, grade, report
from kvagent.cli.app_images import images_app
from kvagent.cli.app_serve import serve
from kvagent.cli.exits import run_app, user_errors
from kvagent.cli.settings import (
    AGENT,
    AGENT_MODEL,
    BENCH_MODEL,
    FROM_OPTIONS,
    ONE_RUN,
    AgentOptions,
    CacheOptions,
    EngineOptions,
    Isolation,
    Network,
    Quiet,
    agent_options,
    cache_options,
    engine_options,
)

app = typer.Typer(
    name="kvagent",
    help="Coding agents over one live, evictable KV cache: solve, evaluate and benchmark eviction policies.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(images_app, name="images")
app.add_typer(bench_app, name="bench")


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"kvagent {version('kvagent')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            from kvagent import __version__

            typer.echo(f"kvagent {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the version and exit.", is_eager=True, callback=_print_version),
    ] = False,
) -> None:
    """Coding agents over one live, evictable KV cache: solve, evaluate and benchmark eviction policies."""


# ----------------------------------------------------------------------------- commands
@app.command()
@user_errors
@cache_options(tokens=["budget"], budget=512)
@engine_options(model=BENCH_MODEL)
def demo(
    engine: EngineOptions = FROM_OPTIONS,
    out: Annotated[str, typer.Option(help="Directory for the results.")] = "demo-out",
    cache: CacheOptions = FROM_OPTIONS,
    turns: Annotated[int, typer.Option(help="Tool calls in the generated episode.")] = 12,
    seed: Annotated[int, typer.Option(help="Episode seed (same seed, same token stream).")] = 0,
    quiet: Quiet = False,
) -> None:
    """The main job on the bundled small model: compare eviction policies on a coding-agent episode."""
    from kvagent.cli.demo import run_demo

    run_demo(engine, out=out, budget=cache.budget, turns=turns, seed=seed, progress=not quiet)


@app.command()
@user_errors
@cache_options(ONE_RUN)
@agent_options(*AGENT)
@engine_options(model=AGENT_MODEL)
def solve(
    issue: Annotated[str, typer.Option(help="The issue text, or a file holding it.")],
    repo: Annotated[
        str | None, typer.Option(help="Local repository (copied; never edited in place).")
    ] = None,
    image: Annotated[str | None, typer.Option(help="Docker image with the repository at /testbed.")] = None,
    engine: EngineOptions = FROM_OPTIONS,
    cache: CacheOptions = FROM_OPTIONS,
    agent: AgentOptions = FROM_OPTIONS,
    out: Annotated[
        str | None,
        typer.Option(help="Directory for episode.traj.json and patch.diff (default runs/solve-TIME)."),
    ] = None,
    isolation: Isolation = "bwrap",
    network: Network = None,
) -> None:
    """Run the agent on one issue in a repository or image."""
    from kvagent.cli.solve import run_solve

    run_solve(
        issue=issue, repo=repo, image=image, engine=engine, out=out, isolation=isolation, network=network,
        cache=cache, agent=agent.fixed(seed=cache.seed),
    )  # fmt: skip


@app.command()
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
    from kvagent.cli.chat import run_chat

    run_chat(
        repo=repo, engine=engine, approval=approval, isolation=isolation,
        cache=cache, agent=agent.fixed(seed=cache.seed), session_file=session,
    )  # fmt: skip


@app.command()
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
    from kvagent.cli.inspect import run_inspect

    run_inspect(path, turn=turn, full=full, html=html)


@app.command()
@user_errors
def clean(
    docker: Annotated[
        bool, typer.Option(help="Also remove containers (skipped with a note if Docker is unreachable).")
    ] = True,
) -> None:
    """Remove sandbox dirs and containers left by kvagent processes that are gone (e.g. SIGKILL)."""
    from kvagent.cli.clean import run_clean

    run_clean(docker=docker)


app.command(name="eval")(eval_)  # the SWE-bench commands are declared in app_eval.py
app.command()(grade)
app.command()(report)
app.command()(serve)  # declared in app_serve.py (its own options)


def main() -> None:
    from kvagent.cli.clean import startup_sweep
    from kvagent.cli.signals import install

    install()  # SIGTERM/SIGHUP stop a run like Ctrl-C, so sandboxes are closed and results kept
    startup_sweep()  # sandboxes and containers left by killed kvagent processes
    sys.exit(run_app(app))
