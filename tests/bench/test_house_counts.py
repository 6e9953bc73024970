"""``swarm-bench house-counts``: what it counts, on a file made for it."""

from __future__ import annotations

from pathlib import Path

from bench.house_counts import counts, file_counts

SOURCE = '''
import os
from typing import Any


class Part:
    def __init__(self, a: Any, b, c, *, d: int = 0) -> None:
        self.a = getattr(self, "a", None)
        self.env = getattr(os, "environ")

    def read(self, other) -> Any:
        x: Any = hasattr(other, "_plan")
        return getattr(other, "run_id", "")
''' + "\n".join(f"    # line {i}" for i in range(3)) + '''


def long() -> None:
''' + "\n".join("    pass" for _ in range(61)) + "\n"


def test_file_counts_sorts_getattr_by_what_it_reads():
    c = file_counts(Path("pkg/part.py"), SOURCE, 60)
    assert c["getattr"] == {"self": 1, "module": 1, "other": 2}
    assert [line.split(": ", 1)[1] for line in c["getattr_other"]] == ["hasattr(other, '_plan')",
                                                                     "getattr(other, 'run_id', '')"]
    assert c["bare_any"] == 3  # a parameter, a return, a variable
    assert [name.split()[-1] for name, _ in c["long_functions"]] == ["long"]
    assert c["constructors"] == [("pkg/part.py:6 Part", 4)]


def test_counts_over_the_project(tmp_path):
    (tmp_path / "learner").mkdir()
    (tmp_path / "learner" / "part.py").write_text(SOURCE)
    c = counts(tmp_path)
    assert c["getattr_hasattr"] == 4 and c["getattr_on_other_objects"] == 2 and c["bare_any"] == 3
    assert c["per_package"]["learner"] == {"getattr_other": 2, "bare_any": 3}
    assert c["largest_constructors"][0][1] == 4 and c["functions_over_60_lines"] == 1
