"""The package's shape: no import cycle inside ``distlock`` (counting imports inside functions
and under ``TYPE_CHECKING``), no module over the size one reads in a sitting, and the layer
contract of setup.cfg (``lint-imports``) kept when import-linter is installed."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from typing import Dict, List, Set

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "distlock")

#: the most lines a module may have (docs/how-it-works.rst, "Layers")
MAX_LINES = 520


def _modules() -> Dict[str, str]:
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path[:-3], ROOT).replace(os.sep, ".")
                found[dotted[: -len(".__init__")] if dotted.endswith(".__init__") else dotted] = path
    return found


def _imports(module: str, path: str, known: Dict[str, str]) -> Set[str]:
    """Every distlock module that ``module`` imports, wherever the import stands."""
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    out = set()
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in known else target)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {m for m in out if m in known and m != module}


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle() -> None:
    known = _modules()
    graph = {m: _imports(m, p, known) for m, p in known.items()}
    # a package's __init__ that re-exports its own modules is not a cycle with them unless one
    # of them imports the package back: that edge is what the graph keeps
    assert _cycles(graph) == []


def test_no_module_is_longer_than_one_sitting() -> None:
    long = {}
    for module, path in _modules().items():
        with open(path, encoding="utf-8") as f:
            lines = sum(1 for _ in f)
        if lines > MAX_LINES:
            long[module] = lines
    assert long == {}


#: import-linter's command: beside this interpreter (a virtual environment), else on PATH
LINT_IMPORTS = next((c for c in (os.path.join(os.path.dirname(sys.executable), "lint-imports"),
                                 shutil.which("lint-imports")) if c and os.path.exists(c)), None)


@pytest.mark.skipif(LINT_IMPORTS is None, reason="import-linter is not installed (the lint extra)")
def test_layers_contract_holds() -> None:
    assert LINT_IMPORTS is not None
    done = subprocess.run([LINT_IMPORTS], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
