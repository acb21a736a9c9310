"""`kvagent images check`: is each instance's recipe good? Builds, F2P fail before gold, the empty
patch fails, gold resolves; one line per instance with the reason under each failed check."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def run_images_check(
    *,
    instances: str,
    dataset: str,
    split: str,
    recipes: list[str] | None,
    rebuild: bool,
    out: str,
    timeout: int,
) -> list[dict[str, Any]]:
    """Check the selected instances; writes OUT/check.json and OUT/ID/{empty,gold}/ logs. Exits 1
    when any instance is not verified, so scripts can gate on it."""
    import typer

    from kvagent.cli.common import check_out_dir
    from kvagent.cli.environments import check_sandbox
    from kvagent.errors import ConfigError
    from kvagent.evals.check import check_instances, format_report
    from kvagent.evals.datasets import load_instances
    from kvagent.evals.recipe import load_recipes
    from kvagent.fileio import atomic_write_json

    if timeout < 1:
        raise ConfigError(f"timeout: must be >= 1 second per test run, got {timeout}")
    check_out_dir(out)  # before the builds and test runs, not after them
    recipe_map = load_recipes(recipes or ())
    targets = load_instances(dataset, split=split, select=instances)
    reports = check_instances(
        targets,
        open_image=check_sandbox,
        recipes=recipe_map,
        rebuild=rebuild,
        timeout=timeout,
        out_dir=out,
        log=typer.echo,
    )
    Path(out).mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(out) / "check.json", reports)
    for rep in reports:
        typer.echo(format_report(rep))
    verified = sum(bool(r["ok"]) for r in reports)
    typer.echo(f"{verified}/{len(reports)} verified (details: {Path(out) / 'check.json'})")
    if verified != len(reports):
        raise typer.Exit(1)
    return reports
