"""Runnable SWE-bench instance images without any container registry (`kvagent images build`).

An image is built from a recipe (package data in `kvagent/evals/recipes/*.json`, or user files):

    {"format": 1,
     "defaults": {"test_cmd": "pytest ...", "python": "3.11"},
     "recipes": {"<instance_id>": {
         "repo": "owner/name",
         "source": {"sdist": "NAME==VER"}            # release sdist from the package registry
                 | {"git": "/path/to/mirror", "commit": "<sha>"},   # commit defaults to base_commit
         "pins": ["pytest==7.4.4", ...],             # installed from wheels, offline, in the image
         "env": {...}, "pre_install": [...], "install": "..."   # optional build steps (recipe_steps.py)
         "test_cmd": "..."}}}                        # only where swebench has no spec (specs.py)

The build: the local base rootfs image (debootstrap, `docker import`) + a venv at /opt/venv with the
pinned wheels (downloaded on the host, installed with `--no-index`, so the build runs with network
off) + the source at /testbed, installed editable and committed as the base commit, so
`git diff` shows exactly what an agent or a patch changed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from kvagent.errors import KvagentError
from kvagent.evals.datasets import Instance
from kvagent.evals.recipe_steps import FIELDS as STEP_FIELDS
from kvagent.evals.recipe_steps import Steps, dockerfile_lines, parse_steps
from kvagent.fileio import cache_dir

BASE_TAG = "kvagent/base:bookworm"
# The swebench harness's pytest command for flask, marshmallow, pydicom and most pytest repos
# (older swebench releases: `TEST_PYTEST` in harness.constants).
TEST_PYTEST = "pytest --no-header -rA --tb=no -p no:cacheprovider"
# The base image is Debian bookworm: CPython 3.11 on x86_64 glibc 2.36; wheels must match it.
WHEEL_PLATFORM = ("manylinux_2_36_x86_64", "linux_x86_64")
# Installed into the venv before the pins. setuptools stays below 70: newer releases warn on, and from
# 81 drop, `pkg_resources`, which older projects import at runtime (pydicom 2.1).
BOOTSTRAP = ("pip", "setuptools>=64,<70", "wheel")
# Bump when the Dockerfile below changes, so cached images are rebuilt.
BUILD_FORMAT = 3
LABEL_INSTANCE = "kvagent.instance_id"
LABEL_RECIPE = "kvagent.recipe"

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class Recipe:
    instance_id: str
    repo: str
    source: Mapping[str, str]
    pins: tuple[str, ...] = ()
    test_cmd: str = TEST_PYTEST
    python: str = "3.11"
    bootstrap: tuple[str, ...] = BOOTSTRAP
    origin: str = ""  # file the recipe came from, for error messages
    extra: Mapping[str, Any] = field(default_factory=dict)
    steps: Steps = field(default_factory=Steps)  # env, pre_install, install

    def digest(self) -> str:
        """Identity of what the image is built from; a cached image with another digest is rebuilt."""
        payload = {
            "format": BUILD_FORMAT,
            "id": self.instance_id,
            "source": dict(self.source),
            "pins": list(self.pins),
            "python": self.python,
            "bootstrap": list(self.bootstrap),
            "steps": self.steps.digest_payload(),
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def source_label(self) -> str:
        if "sdist" in self.source:
            return f"sdist {self.source['sdist']}"
        return f"git {self.source.get('git')}@{self.source.get('commit') or 'base_commit'}"


# --------------------------------------------------------------------------------------------- recipes


def _parse_recipe_file(text: str, origin: str) -> dict[str, Recipe]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise KvagentError(f"recipe file {origin}:{e.lineno}: invalid JSON ({e.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("recipes"), dict):
        raise KvagentError(f"recipe file {origin}: expected an object with a 'recipes' object")
    if data.get("format", 1) != 1:
        raise KvagentError(
            f"recipe file {origin}: unsupported format {data.get('format')!r} (this kvagent reads 1)"
        )
    defaults = data.get("defaults") or {}
    out = {}
    for iid, raw in data["recipes"].items():
        spec = {**defaults, **raw}
        where = f"recipe {iid!r} in {origin}"
        source = spec.get("source")
        if not isinstance(source, dict) or not ({"sdist", "git"} & source.keys()):
            raise KvagentError(f"{where}: 'source' must be {{'sdist': 'NAME==VER'}} or {{'git': PATH}}")
        if "sdist" in source and not re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.!+\-]+", source["sdist"]):
            raise KvagentError(f"{where}: sdist must be pinned as NAME==VERSION, got {source['sdist']!r}")
        if not isinstance(spec.get("repo"), str):
            raise KvagentError(f"{where}: missing field 'repo'")
        pins = spec.get("pins", [])
        if not isinstance(pins, list) or not all(isinstance(p, str) for p in pins):
            raise KvagentError(f"{where}: 'pins' must be a list of requirement strings")
        known = {"repo", "source", "pins", "test_cmd", "python", "bootstrap", *STEP_FIELDS}
        out[iid] = Recipe(
            instance_id=iid,
            repo=spec["repo"],
            source=dict(source),
            pins=tuple(pins),
            test_cmd=spec.get("test_cmd", TEST_PYTEST),
            python=str(spec.get("python", "3.11")),
            bootstrap=tuple(spec.get("bootstrap", BOOTSTRAP)),
            origin=origin,
            extra={k: v for k, v in spec.items() if k not in known},
            steps=parse_steps(spec, where),
        )
    return out


def load_recipes(paths: Iterable[str | os.PathLike[str]] = ()) -> dict[str, Recipe]:
    """The shipped recipes, then each file in `paths` (later files override earlier ones)."""
    recipes: dict[str, Recipe] = {}
    pkg = resources.files("kvagent.evals") / "recipes"
    for entry in sorted(pkg.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".json"):
            recipes.update(
                _parse_recipe_file(entry.read_text(encoding="utf-8"), f"kvagent/evals/recipes/{entry.name}")
            )
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise KvagentError(f"recipe file not found: {path}")
        recipes.update(_parse_recipe_file(path.read_text(encoding="utf-8"), str(path)))
    return recipes


def recipe_for(instance_id: str, recipes: Mapping[str, Recipe] | None = None) -> Recipe:
    recipes = load_recipes() if recipes is None else recipes
    if instance_id not in recipes:
        known = ", ".join(sorted(recipes)) or "none"
        raise KvagentError(
            f"no image recipe for instance {instance_id!r}; known: {known} (add one with --recipes FILE)"
        )
    return recipes[instance_id]


def repo_test_command(instance: Instance, recipes: Mapping[str, Recipe] | None = None) -> str:
    """The repository's test command: the recipe's, else the pytest command swebench uses for
    pytest-based repositories."""
    if isinstance(instance.extra.get("test_cmd"), str):
        return instance.extra["test_cmd"]  # e.g. a fixture or private instance that names its own
    recipes = load_recipes() if recipes is None else recipes
    if instance.instance_id in recipes:
        return recipes[instance.instance_id].test_cmd
    from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY, parse_log_django, parse_log_sympy

    parser = MAP_REPO_TO_PARSER_PY.get(instance.repo)
    if parser is None or parser in (parse_log_django, parse_log_sympy):
        raise KvagentError(
            f"no test command known for {instance.instance_id} ({instance.repo}); give it a recipe with 'test_cmd'"
        )
    return TEST_PYTEST


# ------------------------------------------------------------------------------------------ image names


def instance_image_tag(instance_id: str) -> str:
    """The local image kvagent builds for an instance (Docker wants lower-case repositories)."""
    return f"kvagent/sweb.eval.{instance_id.lower()}:latest"


def official_image_name(instance_id: str) -> str:
    """The official SWE-bench image on Docker Hub (`__` is spelled `_1776_` there)."""
    return f"swebench/sweb.eval.x86_64.{instance_id.replace('__', '_1776_').lower()}:latest"


def docker_client() -> Any:
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise KvagentError(f"Docker is not reachable ({first}); start dockerd or set DOCKER_HOST") from None
    return client


def _has_image(client: Any, tag: str) -> bool:
    import docker

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def image_for(instance: Instance | str, client: Any = None) -> str:
    """Image to run an instance in: a local kvagent build when present, else the image the record
    names (newer datasets carry `image`), else the official SWE-bench image name."""
    iid = instance if isinstance(instance, str) else instance.instance_id
    client = client or docker_client()
    local = instance_image_tag(iid)
    if _has_image(client, local):
        return local
    if isinstance(instance, Instance) and isinstance(instance.extra.get("image"), str):
        return instance.extra["image"]
    return official_image_name(iid)


# ------------------------------------------------------------------------------------------- the build


def ensure_base_image(tag: str = BASE_TAG, client: Any = None, log: Log = _quiet) -> str:
    """The local base image; built with the sandbox's builder when it is missing."""
    client = client or docker_client()
    if _has_image(client, tag):
        return tag
    try:
        from kvagent.sandbox.images import build_base_image
    except ImportError:
        raise KvagentError(f"base image {tag} is missing; build it with `kvagent images base`") from None
    log(f"building base image {tag} (debootstrap; a few minutes)")
    build_base_image(tag=tag)
    return tag


def _run(cmd: Sequence[str], what: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip() and "WARNING" not in ln]
        raise KvagentError(f"{what} failed: {lines[-1] if lines else f'exit {proc.returncode}'}")
    return proc.stdout


def fetch_sdist(requirement: str, log: Log = _quiet) -> Path:
    """The release sdist for NAME==VER, downloaded once into the kvagent cache."""
    dest = cache_dir() / "sdists" / requirement.lower()
    found = (
        [p for p in dest.glob("*") if p.name.endswith((".tar.gz", ".zip", ".tar.bz2", ".tgz"))]
        if dest.is_dir()
        else []
    )
    if not found:
        log(f"downloading sdist {requirement}")
        tmp = Path(tempfile.mkdtemp(prefix=".dl-", dir=_mkdir(dest.parent)))
        try:
            _run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--no-deps",
                    "--no-binary",
                    requirement.split("==")[0],  # build requirements may be wheels (setuptools_scm's)
                    "-d",
                    str(tmp),
                    requirement,
                ],
                f"pip download {requirement}",
            )
            shutil.rmtree(dest, ignore_errors=True)
            os.replace(tmp, dest)  # atomic: a half download never looks cached
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        found = [p for p in dest.glob("*") if p.is_file()]
    if len(found) != 1:
        raise KvagentError(f"expected one sdist for {requirement} in {dest}, found {len(found)}")
    return found[0]


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def _unpack_archive(archive: Path, dest: Path) -> None:
    """Unpack an sdist into `dest`, dropping its single top-level folder (NAME-VER/)."""
    tmp = dest.with_name(dest.name + ".unpack")
    tmp.mkdir(parents=True)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            for member in z.namelist():
                if member.startswith("/") or ".." in Path(member).parts:
                    raise KvagentError(f"{archive.name}: unsafe path {member!r} in archive")
            z.extractall(tmp)
    else:
        with tarfile.open(archive) as t:
            t.extractall(tmp, filter="data")  # refuses absolute paths, links out of the tree
    entries = list(tmp.iterdir())
    top = entries[0] if len(entries) == 1 and entries[0].is_dir() else tmp
    os.replace(top, dest)
    shutil.rmtree(tmp, ignore_errors=True)


def _export_git(mirror: Path, commit: str, dest: Path) -> None:
    if not (mirror / ".git").exists() and not (mirror / "HEAD").exists():
        raise KvagentError(f"git source {mirror} is not a git repository")
    proc = subprocess.run(["git", "-C", str(mirror), "archive", "--format=tar", commit], capture_output=True)
    if proc.returncode != 0:
        msg = proc.stderr.decode(errors="replace").strip().splitlines()
        raise KvagentError(
            f"git archive {commit} from {mirror} failed: {msg[-1] if msg else 'unknown error'}"
        )
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as t:
        t.extractall(dest, filter="data")


def download_wheels(requirements: Sequence[str], dest: Path, python: str = "3.11", log: Log = _quiet) -> None:
    """Distributions for the image's Python (not the host's), dependencies included, into `dest`.

    Wheels for the image's platform first. Old pins can predate any wheel for that Python (MarkupSafe
    2.1.1 has no cp311 wheel): then resolve natively on a matching host, allowing sdists, which the
    image builds offline with its own setuptools.
    """
    log(f"downloading wheels: {' '.join(requirements)}")
    abi = "cp" + python.replace(".", "")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "-d", str(dest), "--only-binary", ":all:"]
    cmd += [
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--abi",
        abi,
        "--abi",
        "abi3",
        "--abi",
        "none",
    ]
    for plat in WHEEL_PLATFORM:
        cmd += ["--platform", plat]
    try:
        _run(cmd + list(requirements), "pip download of the pinned wheels")
        return
    except KvagentError as strict_error:
        host_matches = (
            f"{sys.version_info.major}.{sys.version_info.minor}" == python
            and sys.platform == "linux"
            and platform.machine() == "x86_64"
        )
        if not host_matches:
            raise KvagentError(
                f"{strict_error} (no wheel for Python {python}; build on a Python {python} x86_64 Linux host to allow sdists)"
            ) from None
    log("no wheel for some pins; downloading sdists for them")
    native = [sys.executable, "-m", "pip", "download", "-q", "-d", str(dest), "--prefer-binary"]
    _run(native + list(requirements), "pip download of the pinned requirements")


_DOCKERFILE = """\
FROM {base}
LABEL {label_instance}="{instance_id}" {label_recipe}="{digest}"
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
    base: str = BASE_TAG,
    rebuild: bool = False,
    client: Any = None,
    log: Log = _quiet,
) -> str:
    """Build (or reuse) the image for one instance; returns its tag. A cached image is reused when
    its recipe digest matches, unless `rebuild`."""
    iid = instance if isinstance(instance, str) else instance.instance_id
    recipe = recipe or recipe_for(iid, recipes)
    tag = tag or instance_image_tag(iid)
    client = client or docker_client()
    digest = recipe.digest()
    if not rebuild and _has_image(client, tag):
        labels = client.images.get(tag).labels or {}
        if labels.get(LABEL_RECIPE) == digest:
            log(f"{tag}: up to date")
            return tag
    ensure_base_image(base, client, log)

    with tempfile.TemporaryDirectory(prefix="kvagent-image-") as tmp:
        ctx = Path(tmp)
        testbed = ctx / "testbed"
        if "sdist" in recipe.source:
            _unpack_archive(fetch_sdist(recipe.source["sdist"], log), testbed)
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
            _export_git(Path(git).expanduser(), commit, testbed)
        # A stale .git from the source would replace the base commit we make in the image.
        shutil.rmtree(testbed / ".git", ignore_errors=True)
        wheelhouse = ctx / "wheelhouse"
        wheelhouse.mkdir()
        download_wheels([*recipe.bootstrap, *recipe.pins], wheelhouse, recipe.python, log)
        (wheelhouse / "requirements.txt").write_text("".join(f"{p}\n" for p in recipe.pins) or "\n")
        (wheelhouse / "bootstrap.txt").write_text("".join(f"{p}\n" for p in recipe.bootstrap))
        spec = None
        if isinstance(instance, Instance):
            from kvagent.evals.specs import harness_spec

            spec = harness_spec(instance, log)
        pre_install, install = dockerfile_lines(recipe.steps, spec.install if spec else None)
        (ctx / "Dockerfile").write_text(
            _DOCKERFILE.format(
                base=base,
                label_instance=LABEL_INSTANCE,
                label_recipe=LABEL_RECIPE,
                instance_id=iid,
                digest=digest,
                source_label=recipe.source_label().replace('"', ""),
                pre_install=pre_install,
                install=install,
            )
        )
        log(f"building {tag} from {recipe.source_label()}")
        _docker_build(client, ctx, tag, iid)
    return tag


def _docker_build(client: Any, ctx: Path, tag: str, iid: str) -> None:
    """`docker build` with the network off, so nothing in the image can depend on a registry."""
    log_path = _mkdir(cache_dir() / "build-logs") / f"{iid}.log"
    lines: list[str] = []
    error = None
    try:
        stream = client.api.build(
            path=str(ctx), tag=tag, rm=True, forcerm=True, network_mode="none", decode=True
        )
        for chunk in stream:
            if "stream" in chunk:
                lines.append(chunk["stream"])
            if "error" in chunk:
                error = chunk["error"].strip()
                lines.append(chunk["error"])
    except Exception as e:  # API errors (bad context, daemon gone)
        error = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    log_path.write_text("".join(lines))
    if error:
        tail = [ln.strip() for ln in "".join(lines).splitlines() if ln.strip()]
        detail = next((ln for ln in reversed(tail) if "rror" in ln and ln != error), "")
        raise KvagentError(
            f"building {tag} failed: {error}{' / ' + detail if detail else ''} (log: {log_path})"
        )


def build_images(
    instances: Iterable[Instance | str],
    *,
    recipes: Mapping[str, Recipe] | None = None,
    base: str = BASE_TAG,
    rebuild: bool = False,
    client: Any = None,
    log: Log = _quiet,
) -> list[str]:
    """Build every instance's image (recipes checked up front, so a typo fails before any build)."""
    instances = list(instances)
    recipes = load_recipes() if recipes is None else recipes
    for inst in instances:
        recipe_for(inst if isinstance(inst, str) else inst.instance_id, recipes)
    client = client or docker_client()
    return [
        build_instance_image(inst, recipes=recipes, base=base, rebuild=rebuild, client=client, log=log)
        for inst in instances
    ]
