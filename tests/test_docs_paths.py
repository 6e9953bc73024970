"""The docs run what exists: every ``configs/``, ``examples/`` and ``docs/`` path named in the README or
``docs/*.md`` is a file of the project, and every ``swarm-bench`` sub-command they name exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PATH = re.compile(r"(?<![\w/.-])((?:configs|examples|docs)/[\w./-]+\.(?:toml|py|md|png|svg|json))")
BENCH = re.compile(r"swarm-bench ([a-z][a-z0-9-]+)")


def test_every_path_the_docs_name_exists():
    missing = [f"{doc.relative_to(ROOT)}: {m}" for doc in DOCS for m in PATH.findall(doc.read_text())
               if not (ROOT / m).exists()]
    assert not missing, "docs name files that do not exist:\n" + "\n".join(missing)


def test_every_bench_command_the_docs_name_exists():
    from bench.cli import SUBCOMMANDS

    unknown = sorted({f"{doc.relative_to(ROOT)}: swarm-bench {m}" for doc in DOCS
                      for m in BENCH.findall(doc.read_text()) if m not in SUBCOMMANDS})
    assert not unknown, "docs name swarm-bench commands that do not exist:\n" + "\n".join(unknown)


#: A line that is one upper-case name alone (``SOME_FIGURES``): text left to be filled in.
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$", re.M)
#: ``docs/benchmarks.md``, "Section" (or ``docs/benchmarks.md`` "Section"), as the docs and the code cite it.
SECTION_CITED = re.compile(r"benchmarks\.md`*,?\s+\"([^\"]{3,80})\"")


def test_no_doc_keeps_a_placeholder():
    left = [f"{doc.relative_to(ROOT)}: {m}" for doc in DOCS for m in PLACEHOLDER.findall(doc.read_text())]
    assert not left, "docs keep placeholders never filled in:\n" + "\n".join(left)


def test_every_benchmarks_section_cited_exists():
    heads = [line.lstrip("#").strip() for line in (ROOT / "docs" / "benchmarks.md").read_text().splitlines()
             if line.startswith("#")]
    sources = DOCS + sorted(p for d in ("common", "swarm", "tasks", "node_agents", "learner", "bench")
                            for p in (ROOT / d).rglob("*.py"))
    missing = sorted({f"{src.relative_to(ROOT)}: {name}" for src in sources
                      for name in SECTION_CITED.findall(src.read_text())
                      if not any(h.startswith(name) for h in heads)})
    assert not missing, "sections of docs/benchmarks.md cited but missing:\n" + "\n".join(missing)
