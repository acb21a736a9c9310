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


DEFAULT_MODEL = "agentica-org/DeepSWE-Preview"


def parse_budget(text: str | None) -> int | float | None:
    """`1024` tokens, `0.2` of the logical length, or `none`."""
    from kvagent.errors import ConfigError

    if text is None or text.lower() in ("none", "dense", ""):
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"budget: {text!r} is not a number; pass tokens (1024) or a fraction (0.2)") from None


def parse_policy_args(items: list[str] | None) -> dict[str, Any]:
    """`key=value` pairs; values parsed as JSON when they can be (numbers, true/false), else strings."""
    import json

    from kvagent.errors import ConfigError

    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"policy-arg: {item!r} is not key=value; e.g. --policy-arg lam=0.5")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def make_cache_config(policy, budget, buffer, mode, scope, protect, window, seed, policy_arg):
    from kvagent.runtime import CacheConfig

    return CacheConfig(
        policy=policy,
        budget=parse_budget(budget),
        buffer=buffer,
        mode=mode,
        scope=scope,
        protect=protect,
        window=window,
        seed=seed,
        policy_args=parse_policy_args(policy_arg),
    )


def read_issue(issue: str) -> str:
    """--issue takes the text itself or a path to a file holding it."""
    import os
    from pathlib import Path

    from kvagent.errors import KvagentError

    if not issue.strip():
        raise KvagentError("issue: empty; pass the issue text or a file holding it")
    path = Path(issue).expanduser()
    looks_like_path = "\n" not in issue and " " not in issue.strip() and (bool(path.suffix) or os.sep in issue)
    if looks_like_path:
        if not path.is_file():
            raise KvagentError(f"issue: file {issue} does not exist; pass the issue text or an existing file")
        return path.read_text(encoding="utf-8", errors="replace")
    return issue


# Options shared by the commands that run the agent.
OPT_MODEL = typer.Option(DEFAULT_MODEL, help="smollm2 (bundled), tiny-random-qwen3, a hub id, a dir or .gguf.")
OPT_POLICY = typer.Option("full", help="Eviction policy: full, streaming, random, snapkv, h2o, pyramidkv, nexus.")
OPT_BUDGET = typer.Option(None, help="K entries per head kept (int) or a fraction of the context (0.2).")
OPT_BUFFER = typer.Option(128, help="r: a round fires at K + r entries.")
OPT_MODE = typer.Option("persistent", help="persistent | reprefill.")
OPT_SCOPE = typer.Option("prefill+decode", help="prefill | prefill+decode.")
OPT_PROTECT = typer.Option("prompt", help="prompt | sink | none.")
OPT_WINDOW = typer.Option(16, help="W: recent queries used for scoring.")
OPT_SEED = typer.Option(0, help="Seeds eviction draws and sampling.")
OPT_POLICY_ARG = typer.Option(None, "--policy-arg", help="Policy knob key=value (repeatable), e.g. lam=0.5.")
OPT_DEVICE = typer.Option("auto", help="auto | cpu | cuda[:N].")
OPT_DTYPE = typer.Option("auto", help="auto | float32 | bfloat16 | float16.")


@app.command()
@user_errors
def solve(
    issue: str = typer.Option(..., help="The issue text, or a file holding it."),
    repo: str = typer.Option(None, help="Local repository to work on (copied; never edited in place)."),
    image: str = typer.Option(None, help="Docker image with the repository at /testbed."),
    model: str = OPT_MODEL,
    policy: str = OPT_POLICY,
    budget: str = OPT_BUDGET,
    buffer: int = OPT_BUFFER,
    mode: str = OPT_MODE,
    scope: str = OPT_SCOPE,
    protect: str = OPT_PROTECT,
    window: int = OPT_WINDOW,
    seed: int = OPT_SEED,
    policy_arg: list[str] = OPT_POLICY_ARG,
    max_steps: int = typer.Option(100, help="Hard limit on model calls."),
    max_new_tokens: int = typer.Option(8192, help="Tokens per reply."),
    context_limit: int = typer.Option(65_536, help="Logical tokens; the episode ends cleanly there."),
    temperature: float = typer.Option(1.0, help="Sampling temperature (0 = greedy)."),
    prompt_style: str = typer.Option("repo_first", help="Instance prompt: repo_first (eval) or issue_first (training)."),
    out: str = typer.Option(None, help="Directory for episode.traj.json and patch.diff (default runs/solve-TIME)."),
    device: str = OPT_DEVICE,
    dtype: str = OPT_DTYPE,
) -> None:
    """Run the agent on one issue in a repository or image."""
    from kvagent.agent.runner import run_solve

    run_solve(
        issue_text=read_issue(issue),
        repo=repo,
        image=image,
        model=model,
        cache_config=make_cache_config(policy, budget, buffer, mode, scope, protect, window, seed, policy_arg),
        max_steps=max_steps,
        max_new_tokens=max_new_tokens,
        context_limit=context_limit,
        temperature=temperature,
        prompt_style=prompt_style,
        seed=seed,
        out=out,
        device=device,
        dtype=dtype,
    )


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
