"""How many malloc arenas a long-running process keeps, and giving their free memory back (glibc
only).

glibc gives each thread that allocates its own arena (up to 8 per core) and keeps what is freed
there for reuse. The learner runs forwards of a few hundred MiB of activations in whichever worker
thread the verify queue or the step got, so what one thread freed stayed resident beside what the
next one allocated: +1.0-1.4 GiB against an identical run in
``tests/integration/test_fresh_id_cost.py`` (``docs/benchmarks.md``, "The draw check").
:func:`trim` gives the free memory of every arena back to the system (``malloc_trim``), called by
the learner after each training step and each verify forward: with it the attacked run peaked at
its twin's. :func:`limit_arenas` caps the arenas at the start of a process, before its threads
exist (glibc fixes the limit when a second thread first allocates: ``learner/cli.py`` calls it
before its other imports), which alone was not enough; ``MALLOC_ARENA_MAX`` in the environment,
read by glibc itself, takes precedence.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

#: ``mallopt`` parameter number of ``M_ARENA_MAX`` (glibc's malloc.h).
M_ARENA_MAX = -8
#: Arenas kept by default: the main one and one shared by every other thread.
DEFAULT_ARENAS = 2


@functools.cache
def _libc():
    """glibc, or None (not Linux, or another libc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 - both exist in glibc only
    except (OSError, AttributeError):
        return None
    return libc


def trim() -> bool:
    """Give the free memory of every malloc arena back to the system (blocking, milliseconds);
    False where it does not apply."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(libc.malloc_trim(0))


def limit_arenas(n: int = DEFAULT_ARENAS) -> bool:
    """Cap glibc's malloc arenas at ``n``; False where it does not apply (not Linux, another
    libc, or ``MALLOC_ARENA_MAX`` already set by the user)."""
    libc = _libc()
    if libc is None or os.environ.get("MALLOC_ARENA_MAX"):
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, int(n)))
