"""Image recipes: how an instance's image is built (package data in `kvagent/evals/recipes/*.json`,
or user files), and the repository's test command.

    {"format": 1,
     "defaults": {"test_cmd": "pytest ..."},
     "recipes": {"<instance_id>": {
         "repo": "owner/name",
         "source": {"sdist": "NAME==VER"}            # release sdist from the package registry
                 | {"git": "/path/to/mirror", "commit": "<sha>"},   # commit defaults to base_commit
         "pins": ["pytest==7.4.4", ...],             # installed from wheels, offline, in the image
         "python": "3.11",                           # optional: default the spec's (interpreter.py)
         "env": {...}, "pre_install": [...], "install": "..."   # optional build steps (recipe_steps.py)
         "test_cmd": "..."}}}                        # only where swebench has no spec (specs.py)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from kvagent.errors import KvagentError
from kvagent.evals.datasets import Instance
from kvagent.evals.recipe_steps import FIELDS as STEP_FIELDS
from kvagent.evals.recipe_steps import Steps, parse_steps

# The swebench harness's pytest command for flask, marshmallow, pydicom and most pytest repos
# (older swebench releases: `TEST_PYTEST` in harness.constants).
TEST_PYTEST = "pytest --no-header -rA --tb=no -p no:cacheprovider"
# Installed into the venv before the pins. setuptools stays below 70: newer releases warn on, and from
# 81 drop, `pkg_resources`, which older projects import at runtime (pydicom 2.1).
BOOTSTRAP = ("pip", "setuptools>=64,<70", "wheel")
# Bump when the Dockerfile of images.py changes, so cached images are rebuilt.
BUILD_FORMAT = 4


@dataclass(frozen=True)
class Recipe:
    instance_id: str
    repo: str
    source: Mapping[str, str]
    pins: tuple[str, ...] = ()
    test_cmd: str = TEST_PYTEST
    python: str | None = None  # None: the spec's (kvagent.evals.interpreter.choose_python)
    bootstrap: tuple[str, ...] = BOOTSTRAP
    origin: str = ""  # file the recipe came from, for error messages
    extra: Mapping[str, Any] = field(default_factory=dict)
    steps: Steps = field(default_factory=Steps)  # env, pre_install, install

    def digest(self, spec_python: str | None = None) -> str:
        """Identity of what the image is built from (with the Python the spec names, which picks the
        image's); a cached image with another digest is rebuilt."""
        payload = {
            "format": BUILD_FORMAT,
            "id": self.instance_id,
            "source": dict(self.source),
            "pins": list(self.pins),
            "python": self.python,
            "spec_python": spec_python,
            "bootstrap": list(self.bootstrap),
            "steps": self.steps.digest_payload(),
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def source_label(self) -> str:
        if "sdist" in self.source:
            return f"sdist {self.source['sdist']}"
        return f"git {self.source.get('git')}@{self.source.get('commit') or 'base_commit'}"


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
        python = spec.get("python")
        if python is not None and not re.fullmatch(r"3\.\d+", str(python)):
            raise KvagentError(f"{where}: 'python' must be X.Y (e.g. \"3.9\"), or left out for the spec's")
        out[iid] = Recipe(
            instance_id=iid,
            repo=spec["repo"],
            source=dict(source),
            pins=tuple(pins),
            test_cmd=spec.get("test_cmd", TEST_PYTEST),
            python=None if python is None else str(python),
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
