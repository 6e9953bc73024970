"""The docs name code that exists: every module, class, function, method, file and config key
that ``docs/architecture.md`` (and every other page of ``docs/`` and the README) writes in
backticks is found in the source (read, not imported: no torch).

What counts as a name: a file path (``learner/replay.py``, ``swarm/chunks/``), a dotted path into
a package of ours (``learner.steps.add_problems``, ``swarm.proto.validate.ValidateJob``; also
written ``swarm/dissem/store.VersionStore.accept``), a path and a name
(``swarm/content/store.py: ModelCopy``), ``Class.member`` (``Coordinator.lease``,
``NodeAgent._work_loop``), a bare class name (``LoraAdapter``), and a config key
(``sync.max_staleness``, ``dissem.node_wait_s``). Names of other projects' classes are listed in
:data:`FOREIGN`; anything else in backticks (values, wire fields, protocol ids) is prose.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "swarm", "tasks", "node_agents", "learner", "bench")
DOCS = [ROOT / "docs" / "architecture.md", ROOT / "README.md",
        *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "architecture.md")]
#: Classes of other projects the docs name (transformers, peft, TRL, verifiers, mlx-lm, llama.cpp).
FOREIGN = {"DynamicCache", "KVCache", "LoRALinear", "Llama", "PeftModel", "GRPOTrainer", "GRPOConfig", "LoraConfig", "Env"}
#: Files of other projects the docs name.
FOREIGN_FILES = {"convert_hf_to_gguf.py"}
#: First components of the project's own paths.
TOP_DIRS = set(PACKAGES) | {"tests", "docs", "configs", "examples"}
#: Output files named like dotted names (``swarm.json``, ``config.toml``): not code.
FILE_KINDS = {"json", "jsonl", "toml", "log", "md", "png", "html", "gguf", "safetensors", "txt"}
TICK = re.compile(r"`([^`\n]+)`")
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


@dataclasses.dataclass
class Module:
    names: set[str]
    classes: dict[str, tuple[set[str], list[str]]]  # name -> (members, base names)


def _members(node: ast.ClassDef) -> set[str]:
    out: set[str] = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            out.add(item.target.id)
        elif isinstance(item, ast.Assign):
            out |= {t.id for t in item.targets if isinstance(t, ast.Name)}
    for sub in ast.walk(node):  # self.x = ... in any method
        if isinstance(sub, (ast.Assign, ast.AnnAssign)):
            for t in sub.targets if isinstance(sub, ast.Assign) else [sub.target]:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    out.add(t.attr)
    return out


@lru_cache(maxsize=None)
def index() -> dict[str, Module]:
    """Dotted module name -> its top-level names and classes (with members and bases)."""
    out: dict[str, Module] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text())
            mod = Module(set(), {})
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    mod.names.add(node.name)
                elif isinstance(node, ast.ClassDef):
                    mod.names.add(node.name)
                    bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                             for b in node.bases]
                    mod.classes[node.name] = (_members(node), bases)
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                        if isinstance(t, ast.Name):
                            mod.names.add(t.id)
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    mod.names |= {(a.asname or a.name).split(".")[0] for a in node.names}
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            out[name] = mod
    return out


def _class_has(cls: str, member: str, seen: frozenset = frozenset()) -> bool:
    for mod in index().values():
        if cls in mod.classes and cls not in seen:
            members, bases = mod.classes[cls]
            if member in members or any(_class_has(b, member, seen | {cls}) for b in bases if b):
                return True
    return False


def _in_module(module: str, rest: list[str]) -> bool:
    mod = index()[module]
    if not rest:
        return True
    if rest[0] not in mod.names:
        return False
    return len(rest) == 1 or (len(rest) == 2 and _class_has(rest[0], rest[1]))


def _dotted(text: str) -> bool:
    parts = text.split(".")
    for cut in range(len(parts), 0, -1):
        if ".".join(parts[:cut]) in index():
            return _in_module(".".join(parts[:cut]), parts[cut:])
    return False


def _config_key(text: str) -> bool:
    from learner.config import LearnerConfig

    section, _, field = text.partition(".")
    sections = {f.name: f for f in dataclasses.fields(LearnerConfig)}
    if section not in sections:
        return False
    cls = type(getattr(LearnerConfig(), section))
    return field in {f.name for f in dataclasses.fields(cls)} or _class_has(cls.__name__, field)


def _any_member(member: str) -> bool:
    return any(member in members for mod in index().values() for members, _ in mod.classes.values())


def problem(name: str) -> str | None:
    """Why ``name`` (the text inside backticks) names nothing that exists; None when it exists or
    is not a code name."""
    name = name.strip().rstrip("()")
    m = re.fullmatch(r"((?:[\w.-]+/)+[\w.-]*)(?::\s*(" + IDENT + r"))?", name)
    if m and name.split("/")[0] in PACKAGES and not m.group(2) and "." in name.rsplit("/", 1)[-1] \
            and not name.endswith(".py") and not (ROOT / name).is_file():  # a module written as a path, then a dotted name in it
        return None if _dotted(name.replace("/", ".")) else "not found"
    if m and name.split("/")[0] in TOP_DIRS:  # a file path of the project, optionally with a name in it
        path = ROOT / m.group(1)
        if not path.exists():
            return "no such file"
        if m.group(2) and path.suffix == ".py":
            module = ".".join(Path(m.group(1)).with_suffix("").parts)
            return None if _in_module(module, [m.group(2)]) else f"{m.group(2)} is not in {m.group(1)}"
        return None
    if re.fullmatch(r"[\w./-]+\.py", name) and name not in FOREIGN_FILES:  # a module file named within its package: lora.py, backends/base.py
        return None if any(p.as_posix().endswith("/" + name) for p in ROOT.rglob(name.split("/")[-1])) else "no such file"
    if not re.fullmatch(rf"{IDENT}(\.{IDENT})*", name) or name.split(".")[-1] in FILE_KINDS:
        return None  # prose: a value, a command, a protocol id, an output file
    if name in dir(builtins):
        return None
    head = name.split(".")[0]
    if head in PACKAGES:
        return None if _dotted(name) else "not found"
    if "." not in name:
        if name[0].isupper() and re.search(r"[a-z]", name) and name not in FOREIGN and "_" not in name:
            return None if any(name in m.names for m in index().values()) else "no such class"
        return None
    parts = name.split(".")
    if parts[0][0].isupper() and len(parts) == 2 and parts[0] not in FOREIGN:
        return None if _class_has(parts[0], parts[1]) else "no such member"
    if len(parts) == 2 and parts[0] in {"model", "task", "lora", "train", "sync", "network", "dissem", "dashboard",
                                         "nat", "verify", "run", "pipeline", "replay", "validators", "limits", "report"}:
        return None if _config_key(name) or _any_member(parts[1]) else "no such config key or member"
    return None


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_name_the_docs_give_exists(doc):
    missing = sorted({f"`{n}`: {why}" for n in TICK.findall(doc.read_text()) if (why := problem(n))})
    assert not missing, f"{doc.name} names code that does not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize("name, found", [
    ("learner.steps.add_problems", True), ("learner.steps.no_such", False), ("Coordinator.lease", True),
    ("Coordinator.no_such", False), ("learner/replay.py", True), ("learner/nothing.py", False),
    ("swarm/content/store.py: ModelCopy", True), ("swarm/content/store.py: Nothing", False),
    ("sync.max_staleness", True), ("sync.no_such", False), ("LoraAdapter", True), ("NoSuchThing", False),
    ("learner.buffer.ReplayBuffer.add", True), ("learner.buffer.ReplayBuffer.nope", False),
    ("0.0.0.0", True), ("/echo-swarm/pipeline/1.0.0", True), ("ppo_clip", True), ("lora.py", True),
    ("nothing_here.py", False), ("swarm.json", True), ("None", True),
    ("swarm/dissem/store.VersionStore.accept", True), ("swarm/dissem/store.VersionStore.nope", False),
])
def test_the_resolver_tells_a_name_from_a_missing_one(name, found):
    assert (problem(name) is None) == found, problem(name)


ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc):`([^`]+)`")


def code_problem(target: str) -> str | None:
    """Why a Sphinx cross-reference in a docstring (``learner.verify.Verifier``, ``~.Coordinator.lease``,
    ``_logprobs_of``) names nothing that exists; None when it does."""
    name = target.split("<")[-1].rstrip(">").lstrip("~.")
    if name.split(".")[0] in PACKAGES:
        return None if _dotted(name) else "not found"
    parts = name.split(".")
    if len(parts) == 2 and parts[0][:1].isupper() and parts[0] not in FOREIGN:
        return None if _class_has(*parts) else "no such member"
    if len(parts) == 1 and name not in dir(builtins):
        known = any(name in m.names for m in index().values()) or _any_member(name)
        return None if known else "no such name"
    return None


def test_every_cross_reference_in_the_code_exists():
    bad = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for target in set(ROLE.findall(path.read_text())):
                why = code_problem(target)
                if why:
                    bad.append(f"{path.relative_to(ROOT)}: {target}: {why}")
    assert not bad, "docstrings name code that does not exist:\n" + "\n".join(sorted(bad))


@pytest.mark.parametrize("target, found", [("learner.verify.untrust", False), ("learner.service.LearnerService.untrust", True),
                                           ("measure_rows", False), ("~learner.changes.Changes", False),
                                           ("swarm.changes.Changes", True), ("Verifier.rescore_groups", True)])
def test_the_code_resolver_tells_a_name_from_a_missing_one(target, found):
    assert (code_problem(target) is None) == found
