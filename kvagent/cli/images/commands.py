"""`kvagent images base|build|check`: the image commands' declarations (bodies: build.py, check.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from kvagent.cli.exits import user_errors
from kvagent.cli.settings import Split

images_app = typer.Typer(help="Build and check sandbox images without any registry.", no_args_is_help=True)


@images_app.command("base")
@user_errors
def images_base(
    tag: Annotated[str | None, typer.Option(help="Image tag (default: kvagent/base:SUITE).")] = None,
    rebuild: Annotated[bool, typer.Option(help="Rebuild even if the tag exists.")] = False,
    force: Annotated[bool, typer.Option("--force", hidden=True, help="Old name of --rebuild.")] = False,
    suite: Annotated[
        str,
        typer.Option(
            help="Debian suite for debootstrap: bullseye (Python 3.9), bookworm (3.11) or trixie (3.13); "
            "instance images pick theirs from swebench's spec."
        ),
    ] = "bookworm",
) -> None:
    """Build a registry-free base image (debootstrap + docker import)."""
    from kvagent.cli.images.build import run_images_base

    # --rebuild, as `images build` and `images check` spell it; --force still works.
    run_images_base(tag=tag, force=rebuild or force, suite=suite)


@images_app.command("build")
@user_errors
def images_build(
    instances: Annotated[
        str,
        typer.Option(
            help="Instance ids (comma list) or a selection (re:REGEX, 0:3, repo:owner/name): of --dataset, "
            "else of the shipped recipes' ids."
        ),
    ],
    dataset: Annotated[
        str | None, typer.Option(help="Dataset holding the instances (default: the shipped recipes' ids).")
    ] = None,
    split: Split = "test",
    recipes: Annotated[list[str] | None, typer.Option("--recipes", help="Extra recipe files (JSON).")] = None,
    rebuild: Annotated[bool, typer.Option(help="Rebuild existing images.")] = False,
) -> None:
    """Build runnable SWE-bench instance images offline (base rootfs + sdist + pinned wheels)."""
    from kvagent.cli.images.build import run_images_build

    run_images_build(instances=instances, dataset=dataset, split=split, recipes=recipes, rebuild=rebuild)


@images_app.command("check")
@user_errors
def images_check(
    instances: Annotated[str, typer.Option(help="Instance ids (comma list) or a selection (re:..., 0:3).")],
    dataset: Annotated[str, typer.Option(help="Dataset holding the instances.")],
    split: Split = "test",
    recipes: Annotated[list[str] | None, typer.Option("--recipes", help="Extra recipe files (JSON).")] = None,
    rebuild: Annotated[bool, typer.Option(help="Rebuild existing images.")] = False,
    out: Annotated[str, typer.Option(help="Directory for check.json and the grading logs.")] = "check-out",
    timeout: Annotated[int, typer.Option(help="Seconds per test run.")] = 1800,
) -> None:
    """Is each recipe good? Builds, FAIL_TO_PASS fail before gold, empty patch fails, gold resolves."""
    from kvagent.cli.images.check import run_images_check

    run_images_check(instances=instances, dataset=dataset, split=split, recipes=recipes, rebuild=rebuild,
                     out=out, timeout=timeout)  # fmt: skip
