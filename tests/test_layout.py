"""The core's layout, checked from its import graph (read from the source, not by importing it).

- no import cycle among the modules of ``memstore``, ``encoder`` and ``maintenance``, counting imports
  inside functions and the package ``__init__`` an import runs; imports under ``TYPE_CHECKING`` run no
  code and are left out;
- every package of ``memstore`` says in its docstring what it may import (``May import: ...``), and
  imports nothing else of the project;
- the encoder is a leaf: it imports nothing of ``memstore`` or ``maintenance``;
- ``memstore/`` keeps its concepts in packages: at most 12 top-level modules beside them.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("memstore", "encoder", "maintenance")
# Folders under memstore/ that hold data, not code.
DATA_PACKAGES = ("memstore.ui.static", "memstore.ui.templates")


def _modules(root: Path, tops: tuple[str, ...]) -> dict[str, Path]:
    found = {}
    for top in tops:
        for path in (root / top).rglob("*.py"):
            name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            found[name] = path
    return found


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    nodes: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                nodes.update(id(n) for n in ast.walk(node))
    return nodes


def import_graph(root: Path, tops: tuple[str, ...] = PROJECT) -> dict[str, set[str]]:
    """module -> the project's modules it runs when imported or called (packages' ``__init__``
    included)."""
    modules = _modules(root, tops)
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        skip = _type_checking_nodes(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules] or [base]
            for target in targets:
                while target not in modules and "." in target:
                    target = target.rpartition(".")[0]
                if target not in modules:
                    continue
                parts = target.split(".")
                for i in range(1, len(parts) + 1):
                    ran = ".".join(parts[:i])
                    if ran in modules and ran != name and not name.startswith(ran + "."):
                        graph[name].add(ran)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _unit(module: str) -> str:
    """The package (or top-level module) of memstore a module belongs to; other projects' top name."""
    parts = module.split(".")
    if parts[0] != "memstore" or len(parts) == 1:
        return parts[0]
    return f"memstore.{parts[1]}"


def test_no_import_cycles() -> None:
    assert cycles(import_graph(ROOT)) == []


def test_every_package_imports_only_what_its_docstring_allows() -> None:
    graph = import_graph(ROOT)
    packages = sorted(
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "memstore").glob("*/__init__.py")
        if ".".join(p.parent.relative_to(ROOT).parts) not in DATA_PACKAGES
    )
    undeclared, offenders = [], {}
    for package in packages:
        doc = ast.get_docstring(ast.parse((ROOT / package.replace(".", "/") / "__init__.py").read_text())) or ""
        match = re.search(r"May import:(.*?)(?:\n\n|$)", doc, re.S)
        if package == "memstore.commands":
            continue  # the command line composes everything
        if match is None:
            undeclared.append(package)
            continue
        allowed = {name.strip().rstrip(".") for name in match.group(1).replace("\n", " ").split(",")} | {package}
        used = {_unit(target) for module, targets in graph.items() if _unit(module) == package for target in targets}
        extra = sorted(used - allowed - {"memstore"})
        if extra:
            offenders[package] = extra
    assert undeclared == [], f"packages without 'May import:' in their docstring: {undeclared}"
    assert offenders == {}, offenders


def test_the_encoder_is_a_leaf() -> None:
    graph = import_graph(ROOT)
    reached = sorted({t for m, targets in graph.items() if m.split(".")[0] == "encoder" for t in targets})
    assert [t for t in reached if t.split(".")[0] != "encoder"] == []


def test_memstore_keeps_its_concepts_in_packages() -> None:
    top_level = sorted(p.name for p in (ROOT / "memstore").glob("*.py"))
    assert len(top_level) <= 12, top_level


def test_the_cycle_check_finds_cycles_through_functions_and_packages(tmp_path: Path) -> None:
    """The checker itself: a cycle closed by an import inside a function, or by a package's
    ``__init__``, is found; one closed only under TYPE_CHECKING is not."""
    pkg = tmp_path / "memstore"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from memstore.sub import b\n")
    (pkg / "a.py").write_text("def f():\n    from memstore.sub import b\n")
    (pkg / "sub" / "b.py").write_text("import memstore.c\n")
    (pkg / "c.py").write_text("from memstore import a\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from memstore import e\n")
    (pkg / "e.py").write_text("from memstore import d\n")
    found = cycles(import_graph(tmp_path, ("memstore",)))
    assert found == [["memstore.a", "memstore.c", "memstore.sub", "memstore.sub.b"]]
