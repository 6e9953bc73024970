"""House counts: the coupling the import graph cannot see, counted from the source (pure AST).

- ``getattr``/``hasattr`` calls, by what they are called on: ``self``/``cls`` (an object reading
  itself), an imported module (``getattr(torch, name)``), or anything else (another object: the
  kind that hid the dashboard's bugs; listed with ``--list``);
- bare ``Any`` annotations (a parameter, return or variable annotated ``Any`` itself, not
  ``dict[str, Any]``);
- functions longer than ``--long`` lines;
- the classes whose constructors take the most arguments.

``swarm-bench house-counts`` (``--json PATH`` to keep them, ``--list`` for every ``getattr`` on
another object).
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import Counter
from pathlib import Path

#: The project's packages (bench included).
PACKAGES = ("common", "swarm", "tasks", "node_agents", "learner", "bench")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", type=Path, default=Path("."), help="the project's root")
    p.add_argument("--long", type=int, default=60, help="a function longer than this many lines is long")
    p.add_argument("--top", type=int, default=10, help="classes listed by constructor arguments")
    p.add_argument("--list", action="store_true", help="list every getattr/hasattr on another object")
    p.add_argument("--json", type=Path, default=None, help="write the counts here")


def _imported_modules(tree: ast.AST) -> set[str]:
    """Names bound to modules by ``import x`` / ``import x.y as z`` anywhere in the file."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.add(alias.asname or alias.name.split(".")[0])
    return out


def _is_bare_any(ann: ast.expr | None) -> bool:
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):  # a string annotation
        return ann.value.strip() in ("Any", "typing.Any")
    return (isinstance(ann, ast.Name) and ann.id == "Any") or (
        isinstance(ann, ast.Attribute) and ann.attr == "Any" and isinstance(ann.value, ast.Name)
        and ann.value.id == "typing")


def file_counts(path: Path, text: str, long_lines: int) -> dict:
    """The counts of one source file (see the module)."""
    tree = ast.parse(text, filename=str(path))
    modules = _imported_modules(tree)
    attr: Counter[str] = Counter()
    others: list[str] = []
    bare_any = 0
    long_fns: list[tuple[str, int]] = []
    ctor: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Name) and first.id in ("self", "cls"):
                attr["self"] += 1
            elif isinstance(first, ast.Name) and first.id in modules:
                attr["module"] += 1
            else:
                attr["other"] += 1
                others.append(f"{path}:{node.lineno}: {ast.unparse(node)[:100]}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            params = a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x is not None]
            bare_any += sum(_is_bare_any(p.annotation) for p in params) + _is_bare_any(node.returns)
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > long_lines:
                long_fns.append((f"{path}:{node.lineno} {node.name}", n))
        elif isinstance(node, ast.AnnAssign):
            bare_any += _is_bare_any(node.annotation)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "__init__":
                    a = item.args
                    ctor.append((f"{path}:{node.lineno} {node.name}", len(a.posonlyargs + a.args + a.kwonlyargs) - 1))
    return {"getattr": dict(attr), "getattr_other": others, "bare_any": bare_any, "long_functions": long_fns,
            "constructors": ctor}


def counts(root: Path, long_lines: int = 60, top: int = 10) -> dict:
    """The counts over every package of the project under ``root``."""
    attr: Counter[str] = Counter()
    per_package: dict[str, dict[str, int]] = {}
    others: list[str] = []
    bare_any = 0
    long_fns: list[tuple[str, int]] = []
    ctor: list[tuple[str, int]] = []
    for package in PACKAGES:
        mine = {"getattr_other": 0, "bare_any": 0}
        for path in sorted((root / package).rglob("*.py")):
            c = file_counts(path.relative_to(root), path.read_text(), long_lines)
            attr.update(c["getattr"])
            others += c["getattr_other"]
            bare_any += c["bare_any"]
            long_fns += c["long_functions"]
            ctor += c["constructors"]
            mine["getattr_other"] += len(c["getattr_other"])
            mine["bare_any"] += c["bare_any"]
        per_package[package] = mine
    return {
        "getattr_hasattr": sum(attr.values()), "getattr_on_self": attr["self"], "getattr_on_modules": attr["module"],
        "getattr_on_other_objects": attr["other"], "bare_any": bare_any,
        f"functions_over_{long_lines}_lines": len(long_fns),
        "longest_functions": sorted(long_fns, key=lambda t: -t[1])[:top],
        "largest_constructors": sorted(ctor, key=lambda t: (-t[1], t[0]))[:top],
        "per_package": per_package, "getattr_other_list": others,
    }


def run(args: argparse.Namespace) -> None:
    out = counts(args.root, args.long, args.top)
    listing = out.pop("getattr_other_list")
    print(json.dumps(out, indent=1))
    if args.list:
        print("\n".join(listing))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**out, "getattr_other_list": listing}, indent=1))
