"""Every benchmark runs from a public clone (issue #57): no argparse default of a script under
benchmarks/ names a path outside the repository (as `../shared/data/trajectories_dev.jsonl` was;
`bundled` is the built episode file), and no script under benchmarks/ or scripts/ keeps such a path
as a literal in its code. Before the episode file is built, the scripts that default to it stop with
one line naming `kvagent bench episodes build`, before any model loads.

The defaults are read from each script's own parser: the script runs as `__main__` in a child
process until it calls `parse_args`, which hands the parser back instead of parsing (so required
options and the scripts' imports and side effects stay out of the test process)."""

from __future__ import annotations

import ast
import json
import os
import runpy
import subprocess
import sys
import tempfile
import unittest.mock
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(
    p
    for p in (ROOT / "benchmarks").rglob("*.py")
    if "ArgumentParser(" in p.read_text(encoding="utf-8") and not p.name.startswith("_")
)
PROTOCOL = ROOT / "benchmarks" / "_pyramid_protocol.py"  # its options are pyramid_*.py's


def collect(script: Path) -> dict[str, object]:
    """{option: default} of `script`'s parser (run in this process; the test runs it in a child)."""
    import argparse

    class Parsed(Exception):
        pass

    def capture(self, *args, **kwargs):
        raise Parsed(self)

    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    argparse.ArgumentParser.parse_known_args = capture  # type: ignore[method-assign]
    sys.argv = [str(script)]
    sys.path.insert(0, str(script.parent))
    for _ in range(10):
        try:
            runpy.run_path(str(script), run_name="__main__")
        except Parsed as e:
            parser = e.args[0]
            break
        except ModuleNotFoundError as e:
            # A package only the script's own venv has (kvpress_reference.py: kvpress): a stand-in.
            if not e.name or e.name.split(".")[0] == "kvagent":
                raise
            sys.modules[e.name] = unittest.mock.MagicMock()
        else:
            raise AssertionError(f"{script.name}: ran to the end without parse_args")
    else:
        raise AssertionError(f"{script.name}: too many missing packages")
    return {
        a.option_strings[0] if a.option_strings else a.dest: a.default
        for a in parser._actions
        if a.dest != "help"
    }


def collect_or_error(script: Path) -> dict[str, object]:
    try:
        return collect(script)
    except BaseException as e:  # one script's failure is its own test's, not every script's
        return {"error": f"{type(e).__name__}: {e}"}


def path_parts(value: object) -> list[str]:
    """The parts of a default that name a file: comma lists split, an episode spec's options
    (`FILE:first=2`) and URLs left out; a part is a path when it holds a slash or starts with ~."""
    values = value if isinstance(value, list | tuple) else [value]
    parts = []
    for v in values:
        if not isinstance(v, str | os.PathLike) or "://" in str(v):
            continue
        for part in str(v).split(","):
            head = part.split(":", 1)[0].strip()
            if "/" in head or head.startswith("~"):
                parts.append(head)
    return parts


def outside(path: str) -> bool:
    """Whether `path`, read from the repository root (where every documented command runs),
    leaves the repository."""
    full = Path(os.path.expanduser(path))
    full = Path(os.path.normpath(full if full.is_absolute() else ROOT / full))
    return not full.is_relative_to(ROOT)


def missing_from_a_clone(path: str) -> bool:
    """Outside the repository and not the machine's scratch directory (session_persist.py's --dir
    writes its session files to the temp dir every machine has)."""
    return outside(path) and not Path(path).expanduser().is_relative_to(tempfile.gettempdir())


def test_outside_is_what_a_clone_lacks():
    assert outside("../shared/data/trajectories_dev.jsonl")
    assert outside(str(ROOT.parent / "shared/data/trajectories_dev.jsonl"))
    assert outside("~/data/x.jsonl") and outside("/opt/data/x")
    assert missing_from_a_clone("/opt/data/x") and not missing_from_a_clone(tempfile.gettempdir())
    assert not outside("runs/pyramid-ref") and not outside(str(ROOT / ".venv-kvpress/bin/python"))
    assert path_parts("../shared/data/trajectories_dev.jsonl:plant=0") == [
        "../shared/data/trajectories_dev.jsonl"
    ]
    assert path_parts(["bundled:plant=0", "gen:seed=0"]) == [] and path_parts("http://h:8000/v1") == []


def test_every_parser_is_found():
    """The collector reaches the parser of each script (a script refactored out of reach would make
    the check below vacuous)."""
    names = {p.relative_to(ROOT).as_posix() for p in SCRIPTS}
    assert {
        "benchmarks/reprefill_reuse.py",
        "benchmarks/pyramid_reference.py",
        "benchmarks/pyramid_mass.py",
    } <= names


@pytest.fixture(scope="module")
def defaults() -> dict[str, dict[str, object]]:
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import test_defaults as t; from pathlib import Path; "
        "print(json.dumps({s: t.collect_or_error(Path(s)) for s in sys.argv[2:]}, default=str))"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent), *map(str, SCRIPTS)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_default_leaves_the_repository(defaults, script):
    found = defaults[str(script)]
    assert found and "error" not in found, f"{script.name}: its options were not read: {found}"
    bad = {opt: v for opt, v in found.items() if any(map(missing_from_a_clone, path_parts(v)))}
    assert not bad, f"{script.relative_to(ROOT)}: defaults outside the repository (a clone has none): {bad}"


def test_pyramid_protocol_default_is_the_bundled_file(defaults):
    for name in ("pyramid_reference.py", "pyramid_mass.py"):
        assert defaults[str(ROOT / "benchmarks" / name)]["--episodes"] == "bundled:plant=0"
    assert defaults[str(ROOT / "benchmarks" / "reprefill_reuse.py")]["--episodes"] == "bundled"


def code_strings(path: Path) -> list[str]:
    """String literals of a module's code (docstrings left out: they show commands, not defaults)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


@pytest.mark.parametrize(
    "path",
    sorted([*(ROOT / "benchmarks").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]),
    ids=lambda p: p.relative_to(ROOT).as_posix(),
)
def test_no_literal_path_outside_the_repository(path):
    bad = [s for s in code_strings(path) if s.startswith("../") or "shared/data/" in s]
    assert not bad, f"{path.relative_to(ROOT)}: paths outside the repository in its code: {bad}"


@pytest.mark.parametrize(
    "argv",
    [
        ["benchmarks/reprefill_reuse.py", "--ids", "x"],
        ["benchmarks/pyramid_mass.py", "--out", "{tmp}/out"],
        ["benchmarks/pyramid_reference.py", "--out", "{tmp}/out", "--no-reference"],
        ["scripts/deepswe_thinking_tokens.py"],
    ],
    ids=lambda a: a[0],
)
def test_unbuilt_default_is_one_line_naming_the_build(tmp_path, argv):
    """Before `kvagent bench episodes build`, a default run stops before any model loads with the
    one line that names the build (a fresh clone's first try)."""
    env = {**os.environ, "KVAGENT_CACHE": str(tmp_path / "cache")}
    argv = [a.format(tmp=tmp_path) for a in argv]
    out = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 1 and out.stdout == "", out.stderr[-2000:]
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr[-2000:]
    assert "kvagent bench episodes build" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "cache").exists()  # nothing loaded, converted or built
