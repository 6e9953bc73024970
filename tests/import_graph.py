"""The house's import graph: every import statement of the project's packages (module level or
inside a function), as file-level edges. Checked by ``tests/test_import_graph.py``; run it to
see the rooms and their arrows:

    python tests/import_graph.py            # cycles and upward imports (exit 1 if any)
    python tests/import_graph.py --edges    # every edge, ``a -> b``
    python tests/import_graph.py --local    # function-local imports of the project's own modules

Layers, lowest first: ``common`` (types both roles share) < ``swarm``, ``tasks`` < ``node_agents``
< ``learner`` < ``bench``. A module may import its own layer or lower ones, never a higher one.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"common": 0, "swarm": 1, "tasks": 1, "node_agents": 2, "learner": 3, "bench": 4}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every package in :data:`LAYERS`."""
    out = {}
    for pkg in LAYERS:
        for path in sorted((root / pkg).rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _targets(node: ast.AST, module: str, is_pkg: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = module.split(".") if is_pkg else module.split(".")[:-1]
            parts = parts[: len(parts) - node.level + 1]
            base = ".".join(parts + ([base] if base else []))
        return [base] + [f"{base}.{a.name}" for a in node.names]
    return []


def edges(root: Path = ROOT) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(all edges, function-local edges): module -> the project modules it imports (the
    innermost existing module of each imported name; package ``__init__`` files count only for
    what they define themselves)."""
    mods = modules(root)
    out: dict[str, set[str]] = defaultdict(set)
    local: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        in_function = set()
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                in_function.update(id(n) for n in ast.walk(fn) if n is not fn)
        for node in ast.walk(tree):
            for target in _targets(node, name, path.name == "__init__.py"):
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name and mods[target].name != "__init__.py":
                    out[name].add(target)
                    if id(node) in in_function:
                        local[name].add(target)
    return out, local


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> int:
    return LAYERS[module.split(".")[0]]


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from a lower layer to a higher one."""
    return sorted((a, b) for a, targets in graph.items() for b in targets if layer(b) > layer(a))


def main(argv: list[str]) -> int:
    graph, local = edges()
    if "--edges" in argv:
        for a in sorted(graph):
            for b in sorted(graph[a]):
                print(f"{a} -> {b}")
    if "--local" in argv:
        for a in sorted(local):
            print(f"{a}: {', '.join(sorted(local[a]))}")
    found, up = cycles(graph), upward(graph)
    for comp in found:
        print("cycle: " + " <-> ".join(comp))
    for a, b in up:
        print(f"upward: {a} -> {b}")
    n_local = sum(len(v) for v in local.values())
    print(f"{len(modules())} modules, {sum(len(v) for v in graph.values())} imports "
          f"({n_local} function-local), {len(found)} cycles, {len(up)} upward")
    return 1 if found or up else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
