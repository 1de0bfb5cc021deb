"""The package's import structure: the runtime (horovodlite.common, horovodlite.torch) never
imports the launcher (horovodlite.runner), and no horovodlite modules import each other in a
cycle - counting imports inside functions too, which only postpone a cycle to the first call.

The graph is built from each file's AST, so a module that is never imported by the tests is
checked as well. ``from pkg import name`` counts as an import of ``pkg.name`` when that is a
module, else of ``pkg``; a submodule's implicit import of its parent package does not count
(every submodule that its package's ``__init__`` imports would close a cycle with it)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "horovodlite"
RUNTIME = ("horovodlite.common", "horovodlite.torch")


def modules() -> dict:
    """module name -> (file, is a package)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def imported(node, module: str, is_package: bool, known: dict) -> list:
    """The horovodlite modules an import statement imports."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    base = node.module or ""
    if node.level:  # relative: from the module's package, one level up per extra dot
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[:len(parts) - (node.level - 1)]
        base = ".".join(parts + ([base] if base else []))
    out = []
    for alias in node.names:
        name = f"{base}.{alias.name}"
        if name in known:
            out.append(name)
        elif base in known:
            out.append(base)
    return out


def import_graph() -> dict:
    known = modules()
    graph = {}
    for module, (path, is_package) in known.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets.update(imported(node, module, is_package, known))
        graph[module] = targets - {module}
    return graph


def cycles(graph: dict) -> list:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
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


def test_the_graph_sees_top_level_and_function_level_imports():
    graph = import_graph()
    assert "horovodlite.common.process_sets" in graph["horovodlite.common.basics"]
    assert "horovodlite.common.launch_env" in graph["horovodlite.runner.mpi_launch"]
    assert "horovodlite.torch.functions" in graph["horovodlite.torch.elastic.discovery"]  # in a def
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_runtime_does_not_import_the_launcher():
    graph = import_graph()
    offenders = {m: sorted(t for t in targets if t.startswith("horovodlite.runner"))
                 for m, targets in graph.items() if m.startswith(RUNTIME)}
    assert {m: t for m, t in offenders.items() if t} == {}


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_every_module_imports():
    for module in sorted(modules()):
        if module.endswith("__main__"):
            continue
        importlib.import_module(module)
