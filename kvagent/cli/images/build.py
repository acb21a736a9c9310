"""`kvagent images base|build`: the registry-free base image and offline SWE-bench instance images."""

from __future__ import annotations

from typing import Any

from kvagent.options import split_list


def run_images_base(*, tag: str | None, force: bool, suite: str) -> str:
    import typer

    from kvagent.sandbox.images import build_base_image

    built = build_base_image(tag=tag, force=force, suite=suite)
    typer.echo(built)
    return built


def recipe_selection(spec: str, recipes: dict[str, Any]) -> list[str]:
    """--instances without --dataset: ids, or a selection (re:, a slice, repo:) over the recipes' ids
    (sorted), the same forms a dataset takes."""
    from types import SimpleNamespace

    from kvagent.errors import KvagentError
    from kvagent.evals.datasets import parse_selection, select_instances

    if "ids" in parse_selection(spec):
        return split_list(spec, "instances")  # unknown ids fail in build_images, naming the known ones
    # An instance id is owner__name-NUMBER, so the recipe's repository is in its id.
    known = [
        SimpleNamespace(instance_id=i, repo=i.rsplit("-", 1)[0].replace("__", "/")) for i in sorted(recipes)
    ]
    chosen = [x.instance_id for x in select_instances(known, spec)]
    if not chosen:
        raise KvagentError(
            f"instances: {spec} selects none of the {len(known)} recipes; known: {', '.join(sorted(recipes))}"
        )
    return chosen


def run_images_build(
    *, instances: str, dataset: str | None, split: str, recipes: list[str] | None, rebuild: bool
) -> list[str]:
    import typer

    from kvagent.evals.images import build_images
    from kvagent.evals.recipe import load_recipes

    recipe_map = load_recipes(recipes or ())
    if dataset:
        from kvagent.evals.datasets import load_instances

        targets: list[Any] = load_instances(dataset, split=split, select=instances)
    else:
        targets = recipe_selection(instances, recipe_map)
    tags = build_images(targets, recipes=recipe_map, rebuild=rebuild, log=typer.echo)
    for tag in tags:
        typer.echo(tag)
    return tags
