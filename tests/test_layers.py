"""The package's layers import one way only (DESIGN.md section 3, docs/internals.md).

An AST walk over every module of ``autocvi`` that sees every import statement,
including those inside functions (a function-level import hides a cycle from
Python but not from this test). Two checks: no module imports from a layer
above its own, and the module import graph has no cycle at all.
"""

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "autocvi"

# Lowest first: a module may import only from its own layer or the ones before it.
LAYERS = ("families", "datasets", "jaxpr", "model", "analysis", "blocks", "plan", "engine", "infer")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Absolute names of the autocvi modules a file imports (anywhere in it)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("autocvi")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("autocvi"):
                continue
            for alias in node.names:  # `from . import x` may name a submodule
                sub = f"{target}.{alias.name}"
                found.add(sub if _exists(sub) else target)
    return found


def _exists(module: str) -> bool:
    rel = Path(*module.split("."))
    return (PACKAGE.parent / rel).with_suffix(".py").exists() or (
        PACKAGE.parent / rel / "__init__.py"
    ).exists()


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None  # the top-level package re-exports everything
    if parts[1] not in LAYERS:
        raise AssertionError(f"{module} is in no layer; add its folder to LAYERS in this test")
    return LAYERS.index(parts[1])


MODULES = sorted(PACKAGE.rglob("*.py"))


def import_graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    for path in MODULES:
        src = module_name(path)
        graph.add_node(src)
        for dst in imports_of(path):
            graph.add_edge(src, dst)
    return graph


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_upward_import(path):
    src = module_name(path)
    mine = layer_of(src)
    if mine is None:
        return
    upward = [dst for dst in imports_of(path) if (layer_of(dst) or 0) > mine]
    assert not upward, f"{src} (layer {LAYERS[mine]}) imports from a higher layer: {upward}"


def test_no_import_cycle():
    graph = import_graph()
    # a package's __init__ importing its own submodules is not a cycle of the design
    for src, dst in list(graph.edges):
        if (
            dst.startswith(src + ".")
            and (PACKAGE.parent / Path(*src.split(".")) / "__init__.py").exists()
        ):
            graph.remove_edge(src, dst)
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"import cycles: {cycles}"


def test_the_walk_sees_function_level_and_relative_imports():
    """The checker itself: a function-level relative import is found (completeness)."""
    path = PACKAGE / "plan" / "schedule.py"
    found = imports_of(path)
    assert "autocvi.blocks.gaussian_block" in found
    src = "def f():\n    from ..infer.fit import fit\n"
    tree_file = PACKAGE / "plan" / "_probe_for_layer_test.py"
    try:
        tree_file.write_text(src)
        assert imports_of(tree_file) == {"autocvi.infer.fit"}
        assert layer_of("autocvi.infer.fit") > layer_of("autocvi.plan._probe_for_layer_test")
    finally:
        tree_file.unlink()
