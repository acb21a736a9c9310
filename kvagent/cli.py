"""The `kvagent` command line. Each command's body lives in the layer that owns it; this file only
parses options and turns user errors into one line and a non-zero exit."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

import typer

app = typer.Typer(
    name="kvagent",
    help="Coding agents over one live, evictable KV cache: solve, evaluate and benchmark eviction policies.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
images_app = typer.Typer(help="Build sandbox images without any registry.", no_args_is_help=True)
bench_app = typer.Typer(help="Fidelity and speed benchmarks of eviction policies.", no_args_is_help=True)
app.add_typer(images_app, name="images")
app.add_typer(bench_app, name="bench")


def fail(message: str, code: int = 2) -> None:
    """Print one line to stderr and exit non-zero."""
    typer.echo(f"kvagent: error: {message}", err=True)
    raise typer.Exit(code)


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn KvagentError (bad input, missing resource) into a one-line error and exit 2."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from kvagent.errors import KvagentError

        try:
            return fn(*args, **kwargs)
        except KvagentError as e:
            fail(str(e))
        except KeyboardInterrupt:
            typer.echo("kvagent: interrupted", err=True)
            raise typer.Exit(130) from None

    return wrapper


def not_built(command: str) -> None:
    fail(f"`kvagent {command}` is not built yet in this version; see the project's open issues")


@app.command()
@user_errors
def demo(
    model: str = typer.Option(
        "smollm2", help="Model: smollm2 (bundled), tiny-random-qwen3, or an HF id / dir."
    ),
    out: str = typer.Option("demo-out", help="Directory for the results."),
) -> None:
    """The main job on the bundled small model: compare eviction policies on a coding-agent episode."""
    from kvagent.runtime.demo import run_demo

    run_demo(model=model, out=out)


@app.command()
@user_errors
def solve() -> None:
    """Run the agent on one issue in a repository or image."""
    not_built("solve")


@app.command(name="eval")
@user_errors
def eval_() -> None:
    """Run the agent over SWE-bench instances for each policy x mode x budget x seed."""
    not_built("eval")


@app.command()
@user_errors
def chat() -> None:
    """Interactive agent over a local repository with a bounded cache."""
    not_built("chat")


@app.command()
@user_errors
def grade() -> None:
    """Grade a predictions file against its SWE-bench instances."""
    not_built("grade")


@app.command()
@user_errors
def report() -> None:
    """Resolved / Pass@1 tables, CIs and plots for a run directory."""
    not_built("report")


@images_app.command("base")
@user_errors
def images_base() -> None:
    """Build the registry-free base image (debootstrap + docker import)."""
    not_built("images base")


@images_app.command("build")
@user_errors
def images_build() -> None:
    """Build runnable SWE-bench instance images offline."""
    not_built("images build")


@bench_app.command("fidelity")
@user_errors
def bench_fidelity() -> None:
    """Replay agent episodes under each policy and compare with the full cache."""
    not_built("bench fidelity")


@bench_app.command("speed")
@user_errors
def bench_speed() -> None:
    """Decode latency, eviction-round cost and KV memory per policy."""
    not_built("bench speed")


def main() -> None:
    app(prog_name="kvagent")


if __name__ == "__main__":
    sys.exit(main())
