"""The house rules of docs/architecture.md, checked on the source: imports point one way
(cli -> (evals, bench, serve) -> agent -> (runtime, sandbox)), no import cycle between modules, and no
module over the size a newcomer reads at once."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PKG = Path(__file__).resolve().parents[1] / "kvagent"
# what each layer may import besides itself and the shared top-level modules
ALLOWED = {
    "runtime": set(),
    "sandbox": set(),
    "agent": {"runtime", "sandbox"},
    "evals": {"agent", "runtime", "sandbox"},
    "bench": {"agent", "runtime", "sandbox"},
    "serve": {"agent", "runtime"},
    "cli": {"evals", "bench", "serve", "agent", "runtime", "sandbox"},
}
SHARED = {"errors", "fileio", "options", "runspec", "testing", "__init__", "__main__"}
MAX_LINES = 400
# Files whose one idea needs more, and why (split by idea, never by size).
LIMITS = {
    # every option several commands share, declared once with its help, plus the typed values and
    # the typer and argparse adapters built from those declarations: split, it is two homes again
    "cli/settings.py": 450,
}


def modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports_of(path: Path, name: str, is_pkg: bool, annotations: bool = False) -> set[str]:
    """kvagent modules imported at module level or inside functions (lazy imports count too); imports
    under `if TYPE_CHECKING:` are annotations, not dependencies, unless `annotations`."""
    tree = ast.parse(path.read_text())
    typing_only = set() if annotations else {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for n in ast.walk(stmt)
    }  # fmt: skip
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("kvagent")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.startswith("kvagent"):
                found.add(mod)
                found |= {f"{mod}.{a.name}" for a in node.names}
    return found


def graph(annotations: bool = False) -> nx.DiGraph:
    mods = modules()
    g = nx.DiGraph()
    for name, path in mods.items():
        g.add_node(name)
        for target in imports_of(path, name, path.name == "__init__.py", annotations):
            if target in mods and target != name:
                g.add_edge(name, target)
    return g


def layer(module: str) -> str:
    return module.split(".")[1] if module.count(".") else "__init__"


def test_imports_point_one_way():
    bad = []
    for a, b in graph().edges:
        la, lb = layer(a), layer(b)
        if la == lb or lb in SHARED or la in SHARED:
            continue
        if lb not in ALLOWED.get(la, set()):
            bad.append(f"{a} -> {b}")
    assert not bad, "imports against the layer order: " + ", ".join(sorted(bad))


def test_shared_modules_import_only_the_runtime():
    """errors, fileio, options, runspec serve every layer, so they may lean on the bottom layer only."""
    g = graph()
    bad = [f"{a} -> {b}" for a, b in g.edges if layer(a) in SHARED - {"__init__", "__main__", "testing"}
           and layer(b) not in SHARED | {"runtime"}]  # fmt: skip
    assert not bad, ", ".join(bad)


def test_no_import_cycle_between_modules():
    g = graph()
    # a package's __init__ re-exporting its children is not a cycle of ideas
    g.remove_edges_from([(a, b) for a, b in list(g.edges) if b.startswith(a + ".")])
    cycles = list(nx.simple_cycles(g))
    assert not cycles, f"import cycles: {cycles[:3]}"


def test_no_import_cycle_inside_the_runtime_even_for_annotations():
    """Inside runtime/ a module never imports one that imports it back, not even for a type under
    TYPE_CHECKING: who calls whom reads one way (engine -> session -> evictor -> cache)."""
    g = graph(annotations=True).subgraph(n for n in modules() if n.startswith("kvagent.runtime"))
    g = nx.DiGraph(g)
    g.remove_edges_from([(a, b) for a, b in list(g.edges) if b.startswith(a + ".")])
    cycles = list(nx.simple_cycles(g))
    assert not cycles, f"import cycles inside runtime/: {cycles[:3]}"


@pytest.mark.parametrize("path", sorted(PKG.rglob("*.py")), ids=lambda p: str(p.relative_to(PKG)))
def test_module_size(path):
    n = len(path.read_text().splitlines())
    limit = LIMITS.get(path.relative_to(PKG).as_posix(), MAX_LINES)
    assert n <= limit, f"{path.relative_to(PKG)} has {n} lines; split it by idea (limit {limit})"
