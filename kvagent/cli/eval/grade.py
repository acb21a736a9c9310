"""`kvagent grade`: grade a predictions file in fresh sandboxes (or hand it to swebench's harness)."""

from __future__ import annotations

from collections.abc import Sequence

from kvagent.errors import ConfigError, KvagentError

HARNESSES = ("kvagent", "official")


def run_grade(
    predictions: str,
    dataset: str,
    *,
    split: str,
    instances: str | None,
    out: str,
    timeout: int,
    harness: str,
    recipes: Sequence[str] | None = None,
) -> dict | None:
    import typer

    if harness not in HARNESSES:
        raise ConfigError(f"harness: got {harness!r}; choose kvagent or official")
    if timeout < 1:
        raise ConfigError(f"timeout: must be >= 1 second per instance, got {timeout}")
    if predictions != "gold":
        from pathlib import Path

        from kvagent.evals.grading import load_predictions

        if Path(predictions).is_dir():  # e.g. an eval run's predictions/, one file per configuration
            files = sorted(str(p) for p in Path(predictions).glob("*.json*"))
            hint = f"; e.g. {files[0]}" if files else ""
            raise ConfigError(f"predictions: {predictions} is a directory; pass one predictions file{hint}")
        load_predictions(predictions)  # a bad file fails now, before any sandbox or harness starts
    from kvagent.cli.common import check_out_dir

    check_out_dir(out)
    if harness == "official":
        if recipes:
            raise ConfigError("recipes: the official harness builds its own images; drop --recipes")
        from kvagent.evals.official import run_official_harness

        rc = run_official_harness(predictions, dataset, instances, out, split=split, timeout=timeout)
        if rc:
            raise KvagentError(f"the swebench harness exited with {rc}; its logs are under {out}")
        return None
    from kvagent.cli.environments import grading_sandbox
    from kvagent.evals.datasets import load_instances
    from kvagent.evals.grading import grade_predictions
    from kvagent.evals.recipe import load_recipes
    from kvagent.sandbox.docker_backend import docker_client

    recipe_map = load_recipes(recipes or ())
    load_instances(dataset, split=split, select=instances)  # a missing dataset or id, before Docker
    docker_client()  # a clear error now rather than one per instance

    report = grade_predictions(
        predictions, dataset, instances, out, split=split, timeout=timeout, open_env=grading_sandbox,
        log=typer.echo, recipes=recipe_map,
    )  # fmt: skip
    typer.echo(f"resolved {report['resolved_instances']} of {report['total_instances']}; {out}/report.json")
    return report
