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
