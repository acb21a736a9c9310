"""The SWE-bench commands' declarations: `eval` (the sweep, locally or on Ray, with its grid file),
`grade` (a predictions file) and `report` (a run directory). Registered by app.py; the bodies: run.py
(eval; ray.py under --ray), grade.py, report.py."""

from __future__ import annotations

from typing import Annotated

import typer

from kvagent.cli.exits import fail, user_errors
from kvagent.cli.settings import (
    AGENT,
    AGENT_MODEL,
    FROM_OPTIONS,
    AgentOptions,
    CacheOptions,
    EngineOptions,
    Instances,
    Isolation,
    Network,
    Split,
    agent_options,
    cache_options,
    engine_options,
)


def _grid_file(ctx: typer.Context, value: str | None) -> str | None:
    """`eval --config FILE`: the grid file's settings become the defaults of eval's options, so a flag
    given explicitly overrides its key (read first: the option is eager)."""
    if value:
        import typing

        from kvagent.cli.eval.run import grid_defaults, typed_grid
        from kvagent.errors import KvagentError

        try:
            grid = grid_defaults(value, [p.name for p in ctx.command.params if p.name])
            grid = typed_grid(value, grid, typing.get_type_hints(eval_))
        except KvagentError as e:
            fail(str(e))
        ctx.default_map = {**(ctx.default_map or {}), **grid}
    return value


@user_errors
@cache_options(
    ["buffer", "scope", "protect", "window", "head_budget", "framework", "cadence", "policy_args"],
    many=["policy", "mode", "budget", "seed"],
    policies="full,random,nexus", modes="persistent,reprefill", budgets="1024", seeds="0",
)  # fmt: skip
@agent_options(*(name for name in AGENT if name != "prompt_style"))
@engine_options(model=AGENT_MODEL)
def eval_(
    dataset: Annotated[str, typer.Option(help="SWE-bench instances: .json/.jsonl/.parquet file or HF name.")],
    split: Split = "test",
    instances: Instances = None,
    cache: CacheOptions = FROM_OPTIONS,
    engine: EngineOptions = FROM_OPTIONS,
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
    agent: AgentOptions = FROM_OPTIONS,
    network: Network = None,
    out: Annotated[str, typer.Option(help="Run directory (resumable).")] = "runs/eval",
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
    if ray is not None and isolation != "bwrap":
        fail("--isolation none is not available with --ray; Ray workers always use bwrap")
    if ray is None and (engines is not None or image_registry is not None):
        fail("--engines and --image-registry need --ray (e.g. --ray auto)")
    from kvagent.cli.eval.run import EvalOptions, EvalSweep

    # The options as given, recorded as OUT/grid.yaml (`--config` reads it back).
    grid = {
        "dataset": dataset, "split": split, "instances": instances, **cache.given(), **engine.given(),
        "env": env, "repos": repos, "grade": grade, "concurrency": concurrency, "workers": workers,
        "config": config, **agent.given(), "network": network, "out": out,
        "ray": ray, "engines": engines, "image_registry": image_registry, "isolation": isolation,
    }  # fmt: skip
    sweep = EvalSweep(
        dataset=dataset, split=split, instances=instances, cache=cache, out=out,
        agent=agent.fixed(prompt_style="repo_first", seed=0),
        concurrency=concurrency if workers is None else workers,
    )  # fmt: skip
    options = EvalOptions(
        engine, sweep, env, repos, grade, isolation, network, grid, ray, engines, image_registry
    )
    if ray is not None:  # the same sweep on Ray actors; without --ray, Ray is never imported
        from kvagent.cli.eval.ray import run_eval_ray

        run_eval_ray(options)
    else:
        from kvagent.cli.eval.run import run_eval

        run_eval(options)


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
    from kvagent.cli.eval.grade import run_grade

    run_grade(
        predictions, dataset, split=split, instances=instances, out=out, timeout=timeout, harness=harness,
        recipes=recipes,
    )  # fmt: skip


@user_errors
def report(run_dir: Annotated[str, typer.Argument(help="A `kvagent eval` run directory.")]) -> None:
    """Resolved / Pass@1 tables, CIs and plots for a run directory."""
    from kvagent.cli.eval.report import run_report

    run_report(run_dir)
