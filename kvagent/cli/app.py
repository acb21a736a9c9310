"""The `kvagent` command line: every command and its options, declared with the shared option set
of `params.py` (bad input: one line, exit 2): the top-level commands here, the `images` and `bench`
groups in `app_images.py` and `app_bench.py`. Each body lives in the module of the same name."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from kvagent.cli.app_bench import bench_app
from kvagent.cli.app_images import images_app
from kvagent.cli.app_serve import serve
from kvagent.cli.params import (
    AGENT_MODEL,
    BENCH_MODEL,
    Budget,
    Budgets,
    Buffer,
    ContextLimit,
    Device,
    Dtype,
    HeadBudget,
    History,
    Instances,
    MaxNewTokens,
    MaxSteps,
    Mode,
    Model,
    Modes,
    Network,
    PatchRule,
    Policies,
    Policy,
    PolicyArg,
    Prompts,
    PromptStyle,
    Protect,
    Quiet,
    R2EGym,
    Scaffold,
    Scope,
    Seed,
    Split,
    Temperature,
    TopK,
    TopP,
    Window,
    agent_args,
    cache_args,
    fail,
    run_app,
    user_errors,
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


Isolation = Annotated[
    str,
    typer.Option(
        help="Local sandboxes: bwrap (bubblewrap; refuses to start without it) or none (the model's "
        "commands run on this host, unisolated). Docker containers are always isolated."
    ),
]


# ----------------------------------------------------------------------------- commands
@app.command()
@user_errors
def demo(
    model: Model = BENCH_MODEL,
    out: Annotated[str, typer.Option(help="Directory for the results.")] = "demo-out",
    budget: Annotated[int, typer.Option(help="K: entries per head kept at each eviction round.")] = 512,
    turns: Annotated[int, typer.Option(help="Tool calls in the generated episode.")] = 12,
    seed: Annotated[int, typer.Option(help="Episode seed (same seed, same token stream).")] = 0,
    quiet: Quiet = False,
    device: Device = "auto",
    dtype: Dtype = "auto",
) -> None:
    """The main job on the bundled small model: compare eviction policies on a coding-agent episode."""
    from kvagent.cli.demo import run_demo

    run_demo(model=model, out=out, budget=budget, turns=turns, seed=seed, progress=not quiet,
             device=device, dtype=dtype)  # fmt: skip


@app.command()
@user_errors
def solve(
    ctx: typer.Context,
    issue: Annotated[str, typer.Option(help="The issue text, or a file holding it.")],
    repo: Annotated[
        str | None, typer.Option(help="Local repository (copied; never edited in place).")
    ] = None,
    image: Annotated[str | None, typer.Option(help="Docker image with the repository at /testbed.")] = None,
    model: Model = AGENT_MODEL,
    policy: Policy = "full",
    budget: Budget = None,
    buffer: Buffer = 128,
    mode: Mode = "persistent",
    scope: Scope = "prefill+decode",
    protect: Protect = "prompt",
    window: Window = 16,
    seed: Seed = 0,
    policy_arg: PolicyArg = None,
    head_budget: HeadBudget = "uniform",
    max_steps: MaxSteps = 100,
    max_new_tokens: MaxNewTokens = None,
    context_limit: ContextLimit = 65_536,
    temperature: Temperature = 1.0,
    prompt_style: PromptStyle = "repo_first",
    prompts: Prompts = None,
    r2egym: R2EGym = None,
    scaffold: Scaffold = "kvagent",
    history: History = None,
    patch_rule: PatchRule = None,
    top_p: TopP = None,
    top_k: TopK = None,
    out: Annotated[
        str | None,
        typer.Option(help="Directory for episode.traj.json and patch.diff (default runs/solve-TIME)."),
    ] = None,
    device: Device = "auto",
    dtype: Dtype = "auto",
    isolation: Isolation = "bwrap",
    network: Network = "none",
) -> None:
    """Run the agent on one issue in a repository or image."""
    from kvagent.cli.solve import run_solve

    run_solve(
        issue=issue, repo=repo, image=image, model=model, out=out, device=device, dtype=dtype, isolation=isolation,
        network=network,
        cache={**cache_args(ctx.params), "policy_arg": policy_arg},
        agent=agent_args(ctx.params),
    )  # fmt: skip


@app.command()
@user_errors
def chat(
    ctx: typer.Context,
    repo: Annotated[
        str, typer.Option(help="Local repository (copied; never edited in place); default: this directory.")
    ] = ".",
    model: Model = AGENT_MODEL,
    policy: Policy = "full",
    budget: Budget = None,
    buffer: Buffer = 128,
    mode: Mode = "persistent",
    scope: Scope = "prefill+decode",
    protect: Protect = "prompt",
    window: Window = 16,
    seed: Seed = 0,
    policy_arg: PolicyArg = None,
    head_budget: HeadBudget = "uniform",
    approval: Annotated[
        str, typer.Option(help="confirm: a key (y/n/q) before each tool call; yolo: run all.")
    ] = "confirm",
    max_steps: MaxSteps = 100,
    max_new_tokens: MaxNewTokens = None,
    context_limit: ContextLimit = 65_536,
    temperature: Temperature = 1.0,
    prompt_style: PromptStyle = "repo_first",
    prompts: Prompts = None,
    r2egym: R2EGym = None,
    scaffold: Scaffold = "kvagent",
    history: History = None,
    top_p: TopP = None,
    top_k: TopK = None,
    device: Device = "auto",
    dtype: Dtype = "auto",
    isolation: Isolation = "bwrap",
) -> None:
    """Interactive agent over a local repository with a bounded cache."""
    from kvagent.cli.chat import run_chat

    run_chat(
        repo=repo, model=model, approval=approval, device=device, dtype=dtype, isolation=isolation,
        cache={**cache_args(ctx.params), "policy_arg": policy_arg},
        agent=agent_args(ctx.params),
    )  # fmt: skip


def _grid_file(ctx: typer.Context, value: str | None) -> str | None:
    """`eval --config FILE`: the grid file's settings become the defaults of eval's options, so a flag
    given explicitly overrides its key (read first: the option is eager)."""
    if value:
        import typing

        from kvagent.cli.eval import grid_defaults, typed_grid
        from kvagent.errors import KvagentError

        try:
            grid = grid_defaults(value, [p.name for p in ctx.command.params if p.name])
            grid = typed_grid(value, grid, typing.get_type_hints(eval_))
        except KvagentError as e:
            fail(str(e))
        ctx.default_map = {**(ctx.default_map or {}), **grid}
    return value


@app.command(name="eval")
@user_errors
def eval_(
    ctx: typer.Context,
    dataset: Annotated[str, typer.Option(help="SWE-bench instances: .json/.jsonl/.parquet file or HF name.")],
    split: Split = "test",
    instances: Instances = None,
    policies: Policies = "full,random,nexus",
    modes: Modes = "persistent,reprefill",
    budgets: Budgets = "1024",
    seeds: Annotated[str, typer.Option(help="Comma list of seeds (Pass@1 averages over them).")] = "0",
    model: Model = AGENT_MODEL,
    buffer: Buffer = 128,
    scope: Scope = "prefill+decode",
    protect: Protect = "prompt",
    window: Window = 16,
    head_budget: HeadBudget = "uniform",
    policy_arg: PolicyArg = None,
    env: Annotated[
        str, typer.Option(help="docker (instance images) or local (--repos checkouts).")
    ] = "docker",
    repos: Annotated[
        str | None, typer.Option(help="With --env local: DIR/<instance_id> checkouts at base commit.")
    ] = None,
    grade: Annotated[bool, typer.Option(help="Grade each run in a fresh sandbox.")] = True,
    concurrency: Annotated[
        int, typer.Option(help="Episodes at once over one engine (their forwards batched: max_batch=N).")
    ] = 1,
    workers: Annotated[
        int | None, typer.Option(hidden=True, help="Deprecated name of --concurrency.")
    ] = None,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            help="Grid file (YAML) of eval's options: instances, policies, modes, budgets, seeds, agent "
            "settings...; flags given override it. Each run directory records its grid as grid.yaml.",
            is_eager=True,
            callback=_grid_file,
        ),
    ] = None,
    max_steps: MaxSteps = 100,
    max_new_tokens: MaxNewTokens = None,
    context_limit: ContextLimit = 65_536,
    temperature: Temperature = 1.0,
    prompts: Prompts = None,
    r2egym: R2EGym = None,
    scaffold: Scaffold = "kvagent",
    history: History = None,
    patch_rule: PatchRule = None,
    top_p: TopP = None,
    top_k: TopK = None,
    network: Network = "none",
    out: Annotated[str, typer.Option(help="Run directory (resumable).")] = "runs/eval",
    device: Device = "auto",
    dtype: Dtype = "auto",
    ray: Annotated[
        str | None,
        typer.Option(
            help="Run on a Ray cluster: `auto` (the one on this machine, else a new one) or "
            "its ADDRESS (host:port); needs kvagent\\[ray]. See docs/scale.md."
        ),
    ] = None,
    engines: Annotated[
        int | None, typer.Option(help="With --ray: engines (Ray actors, one GPU each); default: all GPUs.")
    ] = None,
    image_registry: Annotated[
        str | None, typer.Option(help="With --ray and --env docker: pull missing instance images from it.")
    ] = None,
    isolation: Isolation = "bwrap",
) -> None:
    """Run the agent over SWE-bench instances for each policy x mode x budget x seed."""
    if workers is not None:
        typer.echo("kvagent: --workers is deprecated; use --concurrency", err=True)
    if ray is not None:  # the same sweep on Ray actors; without --ray, Ray is never imported
        if isolation != "bwrap":
            fail("--isolation none is not available with --ray; Ray workers always use bwrap")
        if network != "none":
            fail("--network default is not available with --ray; Ray workers' containers have no network")
        from functools import partial

        from kvagent.cli.eval_ray import run_eval_ray

        run_eval = partial(run_eval_ray, ray_address=ray, engines=engines, image_registry=image_registry)
    else:
        if engines is not None or image_registry is not None:
            fail("--engines and --image-registry need --ray (e.g. --ray auto)")
        from functools import partial

        from kvagent.cli.eval import run_eval

        run_eval = partial(run_eval, isolation=isolation, network=network)

    run_eval(
        dataset=dataset, split=split, instances=instances, policies=policies, modes=modes,
        budgets=budgets, seeds=seeds, model=model, policy_arg=policy_arg, env=env, repos=repos,
        grade=grade, out=out, device=device, dtype=dtype, grid=dict(ctx.params),
        concurrency=concurrency if workers is None else workers,
        cache_options=cache_args(ctx.params),  # buffer, scope, protect, window, ...: one value each
        agent=agent_args(ctx.params, prompt_style="repo_first", seed=0),
    )  # fmt: skip


@app.command()
@user_errors
def grade(
    predictions: Annotated[
        str, typer.Argument(help="Predictions JSONL/JSON in SWE-bench format, or `gold`.")
    ],
    dataset: Annotated[str, typer.Option(help="The instances' dataset file or HF name.")],
    split: Split = "test",
    instances: Instances = None,
    out: Annotated[str, typer.Option(help="Directory for report.json and logs.")] = "grade-out",
    timeout: Annotated[int, typer.Option(help="Seconds per instance's tests.")] = 1800,
    harness: Annotated[
        str, typer.Option(help="kvagent (offline images) or official (swebench harness).")
    ] = "kvagent",
    recipes: Annotated[
        list[str] | None, typer.Option("--recipes", help="Extra recipe files (JSON), as for `images build`.")
    ] = None,
) -> None:
    """Grade a predictions file against its SWE-bench instances."""
    from kvagent.cli.grade import run_grade

    run_grade(
        predictions, dataset, split=split, instances=instances, out=out, timeout=timeout, harness=harness,
        recipes=recipes,
    )  # fmt: skip


@app.command()
@user_errors
def report(run_dir: Annotated[str, typer.Argument(help="A `kvagent eval` run directory.")]) -> None:
    """Resolved / Pass@1 tables, CIs and plots for a run directory."""
    from kvagent.cli.report import run_report

    run_report(run_dir)


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


app.command()(serve)  # declared in app_serve.py (its own options)


def main() -> None:
    from kvagent.cli.clean import startup_sweep
    from kvagent.cli.signals import install

    install()  # SIGTERM/SIGHUP stop a run like Ctrl-C, so sandboxes are closed and results kept
    startup_sweep()  # sandboxes and containers left by killed kvagent processes
    sys.exit(run_app(app))
