"""Nothing outside kvagent/runtime reads or writes a private attribute of a runtime object (a
Session, its Evictor, caches, policies, ...) or imports a runtime private: what the rest of kvagent,
the tests and the benchmarks need is public and documented. Checked on the source with `ast`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "kvagent" / "runtime"
SCANNED = [ROOT / "kvagent", ROOT / "tests", ROOT / "benchmarks", ROOT / "scripts"]

# (file relative to the root, private name): why that access stays.
ALLOWED = {
    ("tests/runtime/test_session.py", "_REGISTRY"): (
        "a test-only policy is taken back out of the registry, which has no public unregister"
    ),
    ("tests/runtime/policies/test_model_args.py", "_frequencies"): (
        "TriAttention's frequency derivation is the unit under test"
    ),
    ("tests/runtime/policies/test_triattention.py", "_warn_no_rope"): (
        "the warn-once cache is reset so each test sees its warning"
    ),
    ("tests/runtime/policies/test_snapkv_pyramidkv.py", "_attn"): (
        "the policies' shared attention helper module is unit-tested directly"
    ),
    ("tests/runtime/policies/test_knobs.py", "_args"): (
        "the policies' shared knob helper module is unit-tested directly"
    ),
    ("tests/runtime/policies/test_knobs.py", "_REGISTRY"): (
        "every registered policy class is checked, the registry's classes rather than its names"
    ),
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def runtime_privates() -> set[str]:
    """Private names the runtime defines: module-level names, private modules, and the private
    attributes and methods of its classes (`self._x = ...`, `def _x`)."""
    names = {p.stem for p in RUNTIME.rglob("_*.py") if _private(p.stem)}
    for path in RUNTIME.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {n for n in names if _private(n)}


def accesses(path: Path, privates: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each use of a runtime private: `x._name` (x not self/cls), `getattr(x,
    "_name")`-style calls, and imports of a private runtime name or module."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in privates:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
            "getattr",
            "setattr",
            "hasattr",
        ):
            obj, arg = (node.args + [None, None])[:2]
            own = isinstance(obj, ast.Name) and obj.id in ("self", "cls")
            if not own and isinstance(arg, ast.Constant) and arg.value in privates:
                found.append((node.lineno, arg.value))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvagent.runtime"):
            parts = node.module.split(".") + [a.name for a in node.names]
            found += [(node.lineno, p) for p in parts if _private(p)]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("kvagent.runtime"):
                    found += [(node.lineno, p) for p in a.name.split(".") if _private(p)]
    return found


def test_nothing_outside_the_runtime_touches_its_privates():
    privates = runtime_privates()
    assert {"_evict_layer", "_compact", "_last_logits", "_forward"} <= privates  # the scan sees them
    bad, used = [], set()
    for base in SCANNED:
        for path in sorted(base.rglob("*.py")):
            if path.is_relative_to(RUNTIME):
                continue
            rel = str(path.relative_to(ROOT))
            for line, name in accesses(path, privates):
                if (rel, name) in ALLOWED:
                    used.add((rel, name))
                else:
                    bad.append(f"{rel}:{line} {name}")
    assert not bad, "runtime privates used outside kvagent/runtime (make them public): " + ", ".join(bad)
    assert used == set(ALLOWED), f"allow-list entries no longer needed: {sorted(set(ALLOWED) - used)}"


def test_the_scan_finds_a_private_access(tmp_path):
    src = tmp_path / "probe.py"
    src.write_text(
        "from kvagent.runtime.policies._attn import window_attention\n"
        "def f(session):\n"
        "    session._evict_layer = None\n"
        "    return getattr(session, '_last_logits'), session.cache, self._forward\n"
    )
    assert sorted(n for _, n in accesses(src, runtime_privates())) == [
        "_attn",
        "_evict_layer",
        "_last_logits",
    ]
