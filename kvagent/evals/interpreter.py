"""Which Python an instance image gets, and the note a run carries when it is not the spec's.

swebench's spec names the interpreter each (repo, version) was recorded with (Django 4.1: 3.9), and
that interpreter shapes the log the names are matched in (unittest prints qualified names since
3.11). So an image gets the spec's Python where a Debian release ships it (`sandbox.images.RELEASES`:
bullseye 3.9, bookworm 3.11, trixie 3.13). Where none does, it gets the nearest one the source's
own `requires-python` / `python_requires` admits; on a tie the older, since a release was made
before the newer interpreter and is likelier to use what it removed than what it added. Such a run
says `environment differs: python 3.9 (spec 3.10)`, in its record and in the report.
"""

from __future__ import annotations

import configparser
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from kvagent.errors import KvagentError
from kvagent.sandbox.images import RELEASES, Release, release_for_python

DEFAULT_PYTHON = "3.11"  # instances swebench has no spec for
LABEL_PYTHON = "kvagent.python"
LABEL_SPEC_PYTHON = "kvagent.spec_python"


def _minor(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", str(version))
    if not m:
        raise KvagentError(f"python version {version!r} is not X.Y")
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class PythonChoice:
    python: str  # the image's X.Y
    spec: str | None  # what swebench's spec names; None: no spec
    why: str  # "spec", "nearest", "recipe" or "default"

    @property
    def release(self) -> Release:
        return release_for_python(self.python)

    @property
    def note(self) -> str | None:
        return environment_note(self.python, self.spec)

    def describe(self) -> str:
        """`python 3.9 (the spec's)`, `python 3.9 (nearest to the spec's 3.10)`, ..."""
        why = {
            "spec": "the spec's",
            "nearest": f"nearest to the spec's {self.spec}",
            "recipe": f"the recipe's; spec {self.spec or 'unknown'}",
            "default": "default; swebench has no spec",
        }[self.why]
        return f"python {self.python} ({why})"


def environment_note(python: str | None, spec: str | None) -> str | None:
    """`environment differs: python X.Y (spec A.B)`, or None when they agree or either is unknown."""
    if not python or not spec or _minor(python) == _minor(spec):
        return None
    return f"environment differs: python {python} (spec {spec})"


def note_from_labels(labels: dict[str, str] | None) -> str | None:
    """The note for an image built by kvagent (its labels); None for any other image."""
    labels = labels or {}
    return environment_note(labels.get(LABEL_PYTHON), labels.get(LABEL_SPEC_PYTHON))


def _admits(requires: str | None, python: str) -> bool:
    if not requires:
        return True
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        spec = SpecifierSet(requires)
    except InvalidSpecifier:
        return True  # an unreadable constraint constrains nothing we can act on
    # Any micro release of X.Y will do (`>=3.6.1` admits 3.9; `!=3.9.*` does not).
    return any(spec.contains(f"{python}.{micro}", prereleases=True) for micro in (0, 99))


def choose_python(
    spec_python: str | None, *, requested: str | None = None, requires: str | None = None
) -> PythonChoice:
    """The image's Python: the recipe's `python` if it names one; else the spec's where a release
    ships it; else the nearest available one that `requires` (the source's requires-python)
    admits, the older on a tie; with no spec, DEFAULT_PYTHON (or the nearest it admits)."""
    available = [r.python for r in RELEASES.values()]
    if requested:
        release_for_python(requested)  # a release must ship it; the error names those that do
        return PythonChoice(requested, spec_python, "recipe")
    if spec_python and spec_python in available:
        return PythonChoice(spec_python, spec_python, "spec")
    target = _minor(spec_python or DEFAULT_PYTHON)

    def distance(py: str) -> tuple[int, bool]:
        major, minor = _minor(py)
        return abs((major - target[0]) * 100 + minor - target[1]), (major, minor) > target

    ranked = sorted(available, key=distance)
    admitted = [py for py in ranked if _admits(requires, py)]
    best = (admitted or ranked)[0]
    if not spec_python:
        return PythonChoice(best, None, "default")
    return PythonChoice(best, spec_python, "nearest")


def requires_python(tree: Path) -> str | None:
    """The source's own Python constraint: pyproject's `requires-python`, setup.cfg's or setup.py's
    `python_requires`; None when it states none."""
    pyproject = tree / "pyproject.toml"
    if pyproject.is_file():
        try:
            project = tomllib.loads(pyproject.read_text(errors="replace")).get("project") or {}
        except tomllib.TOMLDecodeError:
            project = {}
        if isinstance(project.get("requires-python"), str):
            return project["requires-python"]
    cfg = tree / "setup.cfg"
    if cfg.is_file():
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(cfg.read_text(errors="replace"))
            value = parser.get("options", "python_requires", fallback=None)
        except configparser.Error:
            value = None
        if value and value.strip():
            return value.strip()
    setup = tree / "setup.py"
    if setup.is_file():
        m = re.search(r"python_requires\s*=\s*['\"]([^'\"]+)['\"]", setup.read_text(errors="replace"))
        if m:
            return m.group(1)
    return None
