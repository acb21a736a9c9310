"""`kvagent images base|build`: the registry-free base image and offline SWE-bench instance images."""

from __future__ import annotations

from typing import Any


def run_images_base(*, tag: str, force: bool, suite: str) -> str:
    import typer

    from kvagent.sandbox.images import build_base_image

    built = build_base_image(tag=tag, force=force, suite=suite)
    typer.echo(built)
    return built


def run_images_build(
    *, instances: str, dataset: str | None, split: str, recipes: list[str] | None, rebuild: bool
) -> list[str]:
    import typer

    from kvagent.evals.images import build_images
    from kvagent.evals.recipe import load_recipes
    from kvagent.options import split_list

    recipe_map = load_recipes(recipes or ())
    if dataset:
        from kvagent.evals.datasets import load_instances

        targets: list[Any] = load_instances(dataset, split=split, select=instances)
    else:
        targets = split_list(instances, "instances")
    tags = build_images(targets, recipes=recipe_map, rebuild=rebuild, log=typer.echo)
    for tag in tags:
        typer.echo(tag)
    return tags
