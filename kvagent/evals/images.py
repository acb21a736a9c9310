"""Runnable SWE-bench instance images without any container registry (`kvagent images build`).

The build, through the sandbox layer's image functions (`kvagent.sandbox.images`): the local base
rootfs image of the Debian release whose python3 is the instance's (`interpreter.py`: the one
swebench's spec names, or the nearest; debootstrap, `docker import`) + a venv at /opt/venv with the pinned wheels (downloaded
on the host, installed with `--no-index`, so the build runs with network off) + the source at
/testbed, installed editable and committed as the base commit, so `git diff` shows exactly what an
agent or a patch changed. What to build comes from a recipe (`recipe.py`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from kvagent.errors import KvagentError
from kvagent.evals.datasets import Instance
from kvagent.evals.image_context import download_wheels, export_git, fetch_sdist, unpack_archive
from kvagent.evals.interpreter import (
    LABEL_PYTHON,
    LABEL_SPEC_PYTHON,
    choose_python,
    note_from_labels,
    requires_python,
)
from kvagent.evals.recipe import Recipe, load_recipes, recipe_for
from kvagent.evals.recipe_steps import dockerfile_lines
from kvagent.fileio import cache_dir
from kvagent.sandbox.images import build_image, ensure_base_image, image_exists, image_labels

LABEL_INSTANCE = "kvagent.instance_id"
LABEL_RECIPE = "kvagent.recipe"

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


# ------------------------------------------------------------------------------------------ image names


def instance_image_tag(instance_id: str) -> str:
    """The local image kvagent builds for an instance (Docker wants lower-case repositories)."""
    return f"kvagent/sweb.eval.{instance_id.lower()}:latest"


def official_image_name(instance_id: str) -> str:
    """The official SWE-bench image on Docker Hub (`__` is spelled `_1776_` there)."""
    return f"swebench/sweb.eval.x86_64.{instance_id.replace('__', '_1776_').lower()}:latest"


def image_for(instance: Instance | str, client: Any = None) -> str:
    """Image to run an instance in: a local kvagent build when present, else the image the record
    names (newer datasets carry `image`), else the official SWE-bench image name."""
    iid = instance if isinstance(instance, str) else instance.instance_id
    local = instance_image_tag(iid)
    if image_exists(local, client):
        return local
    if isinstance(instance, Instance) and isinstance(instance.extra.get("image"), str):
        return instance.extra["image"]
    return official_image_name(iid)


def image_environment(tag: str | None, client: Any = None) -> str | None:
    """`environment differs: python X.Y (spec A.B)` for a kvagent image built on another Python than
    the spec's; None for one that matches, an official image, or no image (a local sandbox)."""
    if not tag:
        return None
    try:
        return note_from_labels(image_labels(tag, client))
    except Exception:  # no Docker here: nothing to compare
        return None


# ------------------------------------------------------------------------------------------- the build


_DOCKERFILE = """\
FROM {base}
LABEL {label_instance}="{instance_id}" {label_recipe}="{digest}" {label_python}="{python}" {label_spec_python}="{spec_python}"
COPY wheelhouse /opt/kvagent/wheelhouse
# Debian's python3 lacks ensurepip: make the venv bare, then bootstrap pip by running the pip wheel itself.
RUN python3 -m venv --without-pip /opt/venv \\
 && /opt/venv/bin/python "$(ls /opt/kvagent/wheelhouse/pip-*.whl | head -n 1)/pip" install -q --no-index \\
      --find-links /opt/kvagent/wheelhouse -r /opt/kvagent/wheelhouse/bootstrap.txt \\
 && /opt/venv/bin/python -m pip install -q --no-index --no-build-isolation --find-links /opt/kvagent/wheelhouse \\
      -r /opt/kvagent/wheelhouse/requirements.txt
ENV VIRTUAL_ENV=/opt/venv \\
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    PIP_NO_INDEX=1 PIP_FIND_LINKS=/opt/kvagent/wheelhouse PIP_DISABLE_PIP_VERSION_CHECK=1 \\
    PYTHONDONTWRITEBYTECODE=1
COPY testbed /testbed
WORKDIR /testbed
{pre_install}
# The recipe's or swebench's install (editable, so patched sources are what the tests import); a .pth
# file if the project cannot build offline.
RUN ({install} \\
      || {{ echo "editable install failed; adding /testbed to sys.path instead"; \\
            d=/testbed; [ -d /testbed/src ] && d=/testbed/src; \\
            echo "$d" > "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/kvagent-testbed.pth"; }}) \\
 && git -c init.defaultBranch=main init -q \\
 && printf '%s\\n' '*.egg-info/' '__pycache__/' '*.pyc' '.pytest_cache/' '/build/' '/.eggs/' >> .git/info/exclude \\
 && git add -A \\
 && git -c user.name=kvagent -c user.email=kvagent@localhost commit -q -m "base: {source_label}" \\
 && git tag kvagent-base
CMD ["/bin/bash"]
"""


def build_instance_image(
    instance: Instance | str,
    *,
    recipe: Recipe | None = None,
    recipes: Mapping[str, Recipe] | None = None,
    tag: str | None = None,
    base: str | None = None,
    rebuild: bool = False,
    client: Any = None,
    log: Log = _quiet,
) -> str:
    """Build (or reuse) the image for one instance; returns its tag. A cached image is reused when
    its recipe digest matches, unless `rebuild`. `base`: default the base image of the release
    whose python3 the instance gets (a given one must hold that Python)."""
    iid = instance if isinstance(instance, str) else instance.instance_id
    recipe = recipe or recipe_for(iid, recipes)
    tag = tag or instance_image_tag(iid)
    spec = None
    if isinstance(instance, Instance):
        from kvagent.evals.specs import harness_spec

        spec = harness_spec(instance, log)
    spec_python = str(spec.specs["python"]) if spec and spec.specs.get("python") else None
    digest = recipe.digest(spec_python)
    if not rebuild and (image_labels(tag, client) or {}).get(LABEL_RECIPE) == digest:
        log(f"{tag}: up to date")
        return tag

    with tempfile.TemporaryDirectory(prefix="kvagent-image-") as tmp:
        ctx = Path(tmp)
        testbed = ctx / "testbed"
        if "sdist" in recipe.source:
            unpack_archive(fetch_sdist(recipe.source["sdist"], log), testbed)
        else:
            git = os.path.expandvars(recipe.source["git"])
            if "$" in git:
                raise KvagentError(
                    f"recipe for {iid}: field 'source.git' is {recipe.source['git']!r}, whose variable is "
                    "not set; clone the repository and set it (e.g. KVAGENT_MIRRORS=DIR holding OWNER/NAME clones)"
                )
            commit = recipe.source.get("commit") or (
                instance.base_commit if isinstance(instance, Instance) else ""
            )
            if not commit:
                raise KvagentError(
                    f"recipe for {iid}: git source needs a 'commit' (or pass the instance record)"
                )
            export_git(Path(git).expanduser(), commit, testbed)
        # A stale .git from the source would replace the base commit we make in the image.
        shutil.rmtree(testbed / ".git", ignore_errors=True)
        choice = choose_python(spec_python, requested=recipe.python, requires=requires_python(testbed))
        log(f"{iid}: {choice.describe()}" + (f"; {choice.note}" if choice.note else ""))
        base = base or choice.release.tag
        ensure_base_image(base, log, client)
        wheelhouse = ctx / "wheelhouse"
        wheelhouse.mkdir()
        download_wheels(
            [*recipe.bootstrap, *recipe.pins], wheelhouse, choice.python, choice.release.glibc, log
        )
        (wheelhouse / "requirements.txt").write_text("".join(f"{p}\n" for p in recipe.pins) or "\n")
        (wheelhouse / "bootstrap.txt").write_text("".join(f"{p}\n" for p in recipe.bootstrap))
        pre_install, install = dockerfile_lines(recipe.steps, spec.install if spec else None)
        (ctx / "Dockerfile").write_text(
            _DOCKERFILE.format(
                base=base,
                label_instance=LABEL_INSTANCE,
                label_recipe=LABEL_RECIPE,
                instance_id=iid,
                digest=digest,
                label_python=LABEL_PYTHON,
                python=choice.python,
                label_spec_python=LABEL_SPEC_PYTHON,
                spec_python=spec_python or "",
                source_label=recipe.source_label().replace('"', ""),
                pre_install=pre_install,
                install=install,
            )
        )
        log(f"building {tag} from {recipe.source_label()}")
        build_image(ctx, tag, cache_dir() / "build-logs" / f"{iid}.log", client)
    return tag


def build_images(
    instances: Iterable[Instance | str],
    *,
    recipes: Mapping[str, Recipe] | None = None,
    base: str | None = None,
    rebuild: bool = False,
    client: Any = None,
    log: Log = _quiet,
) -> list[str]:
    """Build every instance's image (recipes checked up front, so a typo fails before any build)."""
    instances = list(instances)
    recipes = load_recipes() if recipes is None else recipes
    for inst in instances:
        recipe_for(inst if isinstance(inst, str) else inst.instance_id, recipes)
    return [
        build_instance_image(inst, recipes=recipes, base=base, rebuild=rebuild, client=client, log=log)
        for inst in instances
    ]
