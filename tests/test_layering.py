"""The code's layering: no import circle, and every import goes down the table in docs/layout.md.

Every import counts: at the top, inside functions and under ``TYPE_CHECKING``. The table below is the rule;
docs/layout.md says the same in words."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "collectors", "optimizer")

# Lowest first: a module may import modules of its own layer and of the layers above it in this list.
LAYERS = (
    "collectors",  # the real telemetry sources
    "collectors.sim",  # the simulated backend
    "agent",  # the per-node daemon
    "optimizer",  # the package itself (imports nothing)
    "optimizer.ingest",
    "optimizer.decide",
    "optimizer.plan",
    "optimizer.act",
    "optimizer.serve",
    "optimizer.commands",
)
# Modules any layer may import (the wire protocol's home and the metric families): they import nothing of the
# project, so no arrow can come back up through them.
SHARED = ("agent.protocol", "agent.metrics")


def _modules(root: Path) -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in (root / pkg).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path], added: str = "") -> set[str]:
    """The project modules ``name`` imports, wherever the import statement stands."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text() + added, str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[: len(here) - node.level + 1]
                base = ".".join([*here, *([base] if base else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for target in targets:
            found = target
            while found and found not in modules:
                found = found.rpartition(".")[0]
            if found and found != name:
                out.add(found)
    return out


@functools.cache
def _graph() -> dict[str, frozenset[str]]:
    modules = _modules(ROOT)
    return {name: frozenset(_imports(name, path, modules)) for name, path in modules.items()}


def graph(added: dict[str, str] | None = None) -> dict[str, set[str]]:
    """Module -> the modules it imports; ``added`` appends source to some modules (to test the checks)."""
    out = {name: set(imported) for name, imported in _graph().items()}
    modules = _modules(ROOT)
    for name, source in (added or {}).items():
        out[name] = _imports(name, modules[name], modules, source)
    return out


def layer(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len, default=None)
    if best is None:
        raise LookupError(f"{module} is in no layer: add its package to LAYERS and docs/layout.md")
    return LAYERS.index(best)


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def breaches(g: dict[str, set[str]]) -> list[str]:
    out = []
    for module, imported in sorted(g.items()):
        for target in sorted(imported):
            if module in SHARED:
                out.append(f"{module} -> {target}: a shared module imports nothing of the project")
            elif target not in SHARED and layer(target) > layer(module):
                out.append(f"{module} -> {target}: {LAYERS[layer(module)]} may not import {LAYERS[layer(target)]}")
    return out


def test_no_import_circle() -> None:
    assert circles(graph()) == []


def test_every_import_goes_down_the_layers() -> None:
    assert breaches(graph()) == []


def test_every_package_has_a_docstring_that_says_what_it_owns() -> None:
    for init in sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"{init.relative_to(ROOT)} has no docstring"


@pytest.mark.parametrize(
    ("source", "complaint"),
    [
        # a circle through an import inside a function
        ("def f() -> None:\n    from collectors.gpu import x\n", "circle"),
        # a circle through an import under TYPE_CHECKING, written relative
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .gpu import x\n", "circle"),
        # the real collectors reaching up into the agent
        ("from agent.config import x\n", "layer"),
        # the real collectors reaching into the simulator
        ("from collectors.sim import node\n", "layer"),
    ],
)
def test_the_checks_see_every_kind_of_import(source: str, complaint: str) -> None:
    """The packages with one import added: the checks must name it."""
    if complaint == "circle":  # collectors.gpu imports collectors.attribution
        found = circles(graph({"collectors.attribution": "\n" + source}))
        assert any("collectors.gpu" in c and "collectors.attribution" in c for c in found)
    else:
        assert any(b.startswith("collectors.gpu -> ") for b in breaches(graph({"collectors.gpu": "\n" + source})))
    assert circles(graph()) == []
