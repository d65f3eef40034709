"""Issue 26: the product's modules import each other without cycles, counting imports
inside functions (which once hid four of them): a name two modules share lives in a leaf
module both import."""

from __future__ import annotations

import ast

from tests.conftest import ROOT

PACKAGES = ("compat", "gates", "migrate")
#: cycles still tolerated (none: the migrator's phase machine is split into phase modules)
KNOWN: set[frozenset[str]] = set()


def _modules() -> dict[str, ast.Module]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = ast.parse(path.read_text(encoding="utf-8"))
    return out


def _imports(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    """The product modules ``name`` imports anywhere in its code (``from a import b``
    imports ``a.b`` when that is a module, else ``a``)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
                       else node.module for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module."""
    import networkx as nx

    g = nx.DiGraph([(a, b) for a, bs in graph.items() for b in bs])
    return [frozenset(c) for c in nx.strongly_connected_components(g) if len(c) > 1]


def test_no_import_cycles_among_the_products_modules():
    mods = _modules()
    graph = {name: _imports(name, tree, set(mods)) for name, tree in mods.items()}
    # a package's __init__ importing its own submodules is how a package is laid out
    for name in graph:
        graph[name] = {m for m in graph[name] if not m.startswith(name + ".")}
    cycles = [sorted(c) for c in _cycles(graph) if c not in KNOWN]
    assert cycles == [], cycles
