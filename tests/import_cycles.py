"""An import-linter contract that no module of the package takes part in an import cycle.

import-linter's own `acyclic_siblings` compares siblings (with their descendants folded in),
so it does not see a cycle that runs through a package's own `__init__` (`benchfs` ->
`benchfs.client` -> `benchfs.config` -> `benchfs`). This one looks at modules themselves:
every import grimp finds counts, at the top of a module, inside a function or under
`TYPE_CHECKING`. One exception, because grimp cannot tell: `from pkg import name` where
`pkg/name` is a compiled extension (grimp sees only .py files and records the import as one of
`pkg`) imports that extension, which imports nothing of ours.

pyproject.toml names it under `contract_types`; `make lint` puts this directory on the path.
"""

from __future__ import annotations

import ast
import importlib.util
from collections import deque
from itertools import pairwise
from pathlib import Path

import grimp
from grimp import DetailedImport
from importlinter import Contract, ContractCheck, fields, output


class AcyclicModulesContract(Contract):
    """`type = "acyclic_modules"`, `packages = [...]`: no import cycle among their modules."""

    type_name = "acyclic_modules"

    packages = fields.ListField(subfield=fields.StringField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        modules: set[str] = set()
        for package in self.packages:  # type: ignore[attr-defined]
            modules |= {package, *graph.find_descendants(package)}
        imports = {m: counted_imports(graph, m) for m in modules}
        edges = {m: set(imported) & modules for m, imported in imports.items()}
        cycles = sorted(shortest_cycle(component, edges) for component in cycles_of(edges))
        described = [
            [f"{a} -> {b} ({lines(imports[a][b])})" for a, b in pairwise(cycle)] for cycle in cycles
        ]
        return ContractCheck(kept=not cycles, metadata={"cycles": described})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for steps in check.metadata["cycles"]:
            output.print_error("Import cycle:")
            for step in steps:
                output.print_error(f"  {step}", bold=False)
            output.new_line()


def counted_imports(graph: grimp.ImportGraph, module: str) -> dict[str, list[DetailedImport]]:
    """The modules `module` imports, each with its import statements, those that import an
    extension module through its package left out."""
    found = {}
    for imported in graph.find_modules_directly_imported_by(module):
        details = graph.get_import_details(importer=module, imported=imported)
        counted = [d for d in details if not names_extension(imported, d["line_contents"])]
        if counted or not details:
            found[imported] = counted
    return found


def names_extension(package: str, line: str) -> bool:
    """Whether `line` is `from package import a, b` with every name a compiled module (its
    .so, or its stub: a .pyi with no .py, which grimp would have read)."""
    try:
        (node,) = ast.parse(line.strip()).body
    except (SyntaxError, ValueError):
        return False  # a continued line: counted
    if not isinstance(node, ast.ImportFrom) or node.module != package or node.level:
        return False
    spec = importlib.util.find_spec(package.split(".")[0])
    if spec is None or not spec.submodule_search_locations:
        return False
    base = Path(next(iter(spec.submodule_search_locations))).joinpath(*package.split(".")[1:])
    return all(
        any(base.glob(f"{alias.name}.*.so")) or (base / f"{alias.name}.pyi").exists()
        for alias in node.names
    )


def cycles_of(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            nxt = next(successors, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def shortest_cycle(component: set[str], edges: dict[str, set[str]]) -> list[str]:
    """One shortest cycle through the component's first module: [a, b, ..., a]."""
    start = min(component)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(edges[node] & component):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"no cycle in the component {sorted(component)}")


def lines(details: list[DetailedImport]) -> str:
    """Where an import is: `line 12: from b import c; line 40: ...`."""
    return "; ".join(f"line {d['line_number']}: {d['line_contents']}" for d in details)
