"""The collector's modules in layers: its import graph (every import, those inside functions too) has no circle, a
module imports another's private names nowhere, and only the modules that defer loading on purpose import others of
the collector inside functions."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "collector"

# Modules that import others of the collector inside functions, so that each command, or each output, loads only
# what it needs (the playbooks' `stamp` and `unpack` never load pandas; `report --format md` never loads matplotlib).
DEFERRING = {
    "collector.__main__": "each command imports what it runs",
    "collector.outputs": "each output of the registry imports its module when it renders",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _package(name: str) -> str:
    """The package a module's relative imports start from."""
    return name if MODULES[name].name == "__init__.py" else name.rsplit(".", 1)[0]


def _within_functions(tree: ast.AST) -> set[int]:
    """The ids of the import statements inside a function."""
    inner: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inner |= {id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return inner


def imports(name: str) -> list[tuple[str, list[str], bool]]:
    """(module imported, names taken from it, inside a function) for each import of the collector by `name`; a
    module `from package import module` is the module itself."""
    tree = ast.parse(MODULES[name].read_text())
    inner = _within_functions(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], id(node) in inner) for a in node.names if a.name.split(".")[0] == "collector"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package(name).split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] != "collector":
                continue
            taken = []
            for a in node.names:
                if f"{target}.{a.name}" in MODULES:
                    out.append((f"{target}.{a.name}", [], id(node) in inner))
                else:
                    taken.append(a.name)
            if taken or not node.names:
                out.append((target, taken, id(node) in inner))
    return out


def packages(name: str) -> set[str]:
    """The packages a module is in, which load before it."""
    parts = name.split(".")
    return {".".join(parts[:k]) for k in range(1, len(parts))}


def graph() -> dict[str, set[str]]:
    """Each module -> the modules of the collector it loads: those it imports, and the packages they are in (but
    its own, loaded before it; a package counts where a module takes names from it)."""
    return {name: {m for target, _, _ in imports(name) for m in {target, *(packages(target) - packages(name))}}
            - {name} for name in MODULES}


def test_every_import_names_a_module_of_the_collector() -> None:
    for name in MODULES:
        for target, _, _ in imports(name):
            assert target in MODULES, (name, target)


def test_the_import_graph_has_no_circle() -> None:
    edges = graph()
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == "done":
            return
        assert state.get(name) != "open", " -> ".join([*path[path.index(name):], name])
        state[name] = "open"
        for target in sorted(edges[name]):
            visit(target, [*path, name])
        state[name] = "done"
        order.append(name)

    for name in sorted(MODULES):
        visit(name, [])
    assert len(order) == len(MODULES)


def test_no_private_name_is_imported_from_another_module() -> None:
    found = [(name, target, n) for name in MODULES for target, taken, _ in imports(name) for n in taken
             if n.startswith("_")]
    assert found == []


def test_only_the_deferring_modules_import_the_collector_inside_functions() -> None:
    found = {name for name in MODULES for _, _, inner in imports(name) if inner}
    assert found <= set(DEFERRING), found - set(DEFERRING)
