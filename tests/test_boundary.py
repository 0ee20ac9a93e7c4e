"""The package boundary: the host agent is standard library only (it is what is copied to hosts, Python 3.9+)
and imports nothing of the controller; the controller side reaches the agent as a package, never through
`sys.path` edits; the Ansible plugins only call into the packages."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

from tests.conftest import ROOT

CONTROLLER_SIDE = ["controller", "collector", "plugins", "roles"]


def imports(path: Path) -> set[str]:
    """Top-level names of the absolute imports of a module."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
    return names


def test_the_agent_needs_only_the_standard_library() -> None:
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    for path in sorted((ROOT / "agent").glob("*.py")):
        assert imports(path) <= allowed, (path.name, imports(path) - allowed)


def test_the_agent_parses_as_python_3_9() -> None:
    for path in sorted((ROOT / "agent").glob("*.py")):
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 9))


def test_nothing_edits_sys_path() -> None:
    for folder in ["agent", *CONTROLLER_SIDE, "tests", "benchmarks", "tools"]:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "fixtures" in path.parts or path == Path(__file__):
                continue
            tree = ast.parse(path.read_text())
            edits = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in ("insert", "append")
                     and isinstance(n.value, ast.Attribute) and n.value.attr == "path"
                     and isinstance(n.value.value, ast.Name) and n.value.value.id == "sys"]
            assert not edits, path


def test_the_plugins_are_glue() -> None:
    """Each plugin under plugins/ is short and calls into controller/ or agent/ for its logic."""
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        text = path.read_text()
        assert len(text.splitlines()) <= 80, (path, len(text.splitlines()))
        assert imports(path) & {"controller", "agent"}, path


def modules(path: Path) -> set[str]:
    """The full names of the absolute imports of a module."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


def test_the_controller_does_not_reach_the_collector() -> None:
    """Planning reads earlier results through the records' own stdlib reader (agent.records), not the report's
    package (which brings pandas and numpy into every plan). Of the collector it takes the words of a cell alone
    (collector.vocab), which need nothing but the standard library and the agent."""
    for path in sorted((ROOT / "controller").glob("*.py")):
        assert not imports(path) & {"pandas", "numpy", "matplotlib"}, path.name
        assert {m for m in modules(path) if m.split(".")[0] == "collector"} <= {"collector.vocab"}, path.name
    allowed = set(sys.stdlib_module_names) | {"__future__", "agent"}
    for name in ("__init__.py", "vocab.py"):
        assert imports(ROOT / "collector" / name) <= allowed, name
