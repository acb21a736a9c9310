"""The `kvagent` command line: the root command and every command registered on it, declared with the
shared option set of `settings.py` (bad input: one line, exit 2, by `exits.py`). demo, solve and
clean are declared here (bodies: demo.py, solve.py, clean.py); each family of commands declares its
own in its sub-package's `commands.py`, beside its body and output: `chat/`, `inspect/`, `eval/`
(eval, grade, report), `serve/`, and the `images` and `bench` groups."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from kvagent.cli.bench.commands import bench_app
from kvagent.cli.chat.commands import chat
from kvagent.cli.eval.commands import eval_, grade, report
from kvagent.cli.exits import run_app, user_errors
from kvagent.cli.images.commands import images_app
from kvagent.cli.inspect.commands import inspect
from kvagent.cli.serve.commands import serve
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


@user_errors
def clean(
    docker: Annotated[
        bool, typer.Option(help="Also remove containers (skipped with a note if Docker is unreachable).")
    ] = True,
) -> None:
    """Remove sandbox dirs and containers left by kvagent processes that are gone (e.g. SIGKILL)."""
    from kvagent.cli.clean import run_clean

    run_clean(docker=docker)


# Every command in the order `kvagent --help` lists them. A family of commands declares its own
# (options beside its body and output, in its sub-package); demo, solve and clean are declared above,
# their bodies one module each beside this one.
app.command()(demo)
app.command()(solve)
app.command()(chat)
app.command()(inspect)
app.command()(clean)
app.command(name="eval")(eval_)
app.command()(grade)
app.command()(report)
app.command()(serve)


def main() -> None:
    from kvagent.cli.clean import startup_sweep
    from kvagent.cli.signals import install

    install()  # SIGTERM/SIGHUP stop a run like Ctrl-C, so sandboxes are closed and results kept
    startup_sweep()  # sandboxes and containers left by killed kvagent processes
    sys.exit(run_app(app))
