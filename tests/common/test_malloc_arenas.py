"""The malloc arena cap (``common/malloc_arenas.py``): applied on glibc Linux, left to the user's
``MALLOC_ARENA_MAX`` when set; and what it is for, measured in a child process: freed activations
of forwards run in many threads stay resident with glibc's default arenas and not once the
learner's entry point (``learner/cli.py``) has capped them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from common.malloc_arenas import limit_arenas

CHILD = r"""
import sys, threading
if sys.argv[1] == "capped":  # as the learner's entry point does it, before anything else
    import learner.cli
turn, pins = threading.Lock(), []
def work():  # one at a time, as forwards in a pool of worker threads: 40 MB of activations freed,
    with turn:  # one small block allocated after them left alive (what fragments a real heap)
        blocks = [bytearray(100_000) for _ in range(400)]
        pins.append(bytearray(64))
        del blocks
    done.wait()
done = threading.Event()
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
while len(pins) < len(threads): pass
print(int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20)
done.set()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_cap_applies_and_keeps_freed_memory_of_many_threads_from_staying_resident(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert limit_arenas(8)  # (a generous cap in this test process)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert not limit_arenas()  # the user's setting wins
    monkeypatch.delenv("MALLOC_ARENA_MAX")

    def resident(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).resolve().parents[2])
        return int(out.stdout.split()[-1])

    plain, capped = resident("plain"), resident("capped")
    print(f"resident after 8 threads freed 40 MB each: {plain} MiB with glibc's arenas, {capped} MiB capped")
    assert capped < plain


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_trim_gives_back_what_threads_freed():
    child = CHILD.replace('if sys.argv[1] == "capped":  # as the learner\'s entry point does it, before anything else\n    import learner.cli',
                          "").replace("print(int(", "from common.malloc_arenas import trim\nassert trim()\nprint(int(")
    out = subprocess.run([sys.executable, "-c", child, "plain"], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert int(out.stdout.split()[-1]) < 60, out.stdout  # 95 MiB without the trim
