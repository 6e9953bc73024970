"""How a command line ends on an error: one exit status per kind of error, said in one line.

Both entry points (``swarm-learner``, ``swarm-node``) declare their ladder as :class:`Exit` rows
and call :func:`exit_status` on what their run raised; trio nurseries wrap errors in (nested)
exception groups, which :func:`leaves` opens.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO


@dataclass(frozen=True)
class Exit:
    """Exit status ``code`` for an error of one of ``kinds``, reported as ``<prog>: <lead><error>``."""

    kinds: tuple[type[BaseException], ...]
    code: int
    lead: str = ""


#: Ctrl-C: the shells' own status for SIGINT.
INTERRUPTED = Exit((KeyboardInterrupt,), 130, "interrupted")


def leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside ``error``'s (nested) exception groups, or ``[error]`` itself."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for e in error.exceptions for leaf in leaves(e)]
    return [error]


def rung(error: BaseException, ladder: tuple[Exit, ...]) -> tuple[Exit, BaseException] | None:
    """The first row of ``ladder`` that handles ``error`` and the error it reports: the error
    itself, or the first of the exceptions a group wraps when the ladder handles every one of
    them (a group holding anything else is no error of the ladder's: None)."""
    found: list[tuple[Exit, BaseException]] = []
    for leaf in leaves(error):
        row = next((r for r in ladder if isinstance(leaf, r.kinds)), None)
        if row is None:
            return None
        found.append((row, leaf))
    return found[0] if found else None


def exit_status(prog: str, error: BaseException, ladder: tuple[Exit, ...], err: TextIO | None = None) -> int | None:
    """Say ``error`` in one line on ``err`` (stderr) and return its row's status; None when the
    ladder does not handle it (the caller re-raises: a bug shows its traceback)."""
    hit = rung(error, ladder)
    if hit is None:
        return None
    row, leaf = hit
    text = row.lead if isinstance(leaf, KeyboardInterrupt) else f"{row.lead}{leaf}"
    print(f"{prog}: {text}", file=err or sys.stderr)
    return row.code
