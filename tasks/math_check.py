"""Answer checking with math-verify: is a model's final answer mathematically the reference?

Two steps, each a pure function:

1. :func:`parse_answer_line` keeps the strict shape of :mod:`tasks.base` (the last non-empty
   line is ``Answer: <value>``, exactly one answer marker in the whole completion, length caps)
   but lets ``<value>`` be any text; a completion that breaks the shape scores 0.
2. :func:`answers_match` decides equivalence with math-verify (``parse`` + ``verify``): ``7``,
   ``7.0``, ``$7$``, ``\\boxed{7}``, ``14/2``, ``\\frac{14}{2}`` and ``1,234`` (for 1234) all
   match. Before math-verify sees a value, :func:`single_expression` requires it to be one
   expression: math-verify takes the *last* number of a text, so ``3, 7`` or ``7 apples``
   would match 7 and a model could list candidates; those are refused. Powers and factorials
   are refused too, so no value can make sympy compute a huge number (math-verify's own
   timeout uses ``signal.alarm`` and works only in a main thread; it is off here, the learner
   scores in worker threads). A reference that math-verify cannot read as mathematics (a word,
   a name) is compared as text, case-insensitively.

``swarm-bench math-verify`` reports how often this agrees with the old integer-only check and
lists where they differ (``docs/benchmarks.md``).
"""

from __future__ import annotations

import functools
import logging
import re

log = logging.getLogger("echo_swarm.tasks")

MAX_COMPLETION_CHARS = 4000
"""Completions longer than this (characters) score 0 without being parsed."""

MAX_VALUE_CHARS = 64
"""An answer value longer than this (characters) is refused before math-verify sees it."""

_MARKER = re.compile(r"answer[ \t]*[:=]", re.IGNORECASE)
_LINE = re.compile(r"Answer:[ \t]*(.+?)[ \t]*", re.ASCII)
_LATEX_WORDS = re.compile(r"\\(?:frac|dfrac|tfrac|boxed|left|right|cdot|times|div|,|!|;| )")
_THOUSANDS = re.compile(r"(?<![0-9.])[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])")
_ALLOWED = re.compile(r"[0-9 .+\-*/(){}$]*")


def parse_answer_line(text: str) -> str | None:
    """The value of a well-formed final ``Answer: <value>`` line, or ``None`` (see the module
    docstring; a trailing full stop is dropped)."""
    if not isinstance(text, str) or len(text) > MAX_COMPLETION_CHARS:
        return None
    lines = [ln.strip() for ln in text.strip().splitlines()]
    if not lines or not lines[-1]:
        return None
    m = _LINE.fullmatch(lines[-1])
    if m is None or len(_MARKER.findall(text)) != 1:
        return None
    value = m.group(1).rstrip(".").strip()
    return value or None


def single_expression(value: str) -> bool:
    """True when ``value`` is one arithmetic expression: digits, ``. + - * / ( ) { } $``,
    spaces, the LaTeX commands ``\\frac \\dfrac \\tfrac \\boxed \\left \\right \\cdot \\times
    \\div`` and thousands separators (``1,234``); no letters, lists, equations, powers."""
    if not isinstance(value, str) or not value or len(value) > MAX_VALUE_CHARS or "**" in value:
        return False
    rest = _THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), _LATEX_WORDS.sub(" ", value))
    return bool(_ALLOWED.fullmatch(rest)) and any(c.isdigit() for c in rest)


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> tuple:
    from math_verify import parse

    try:
        return tuple(parse(text, parsing_timeout=None))
    except Exception as e:  # math-verify on odd text: treat as unreadable
        log.debug("math-verify could not parse %r: %r", text, e)
        return ()


def _quiet_math_verify() -> None:
    """math-verify warns once that its timeout is off; it is off on purpose (module docstring)."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    logging.getLogger("math_verify.grader").setLevel(logging.ERROR)
    logging.getLogger("math_verify.parser").setLevel(logging.ERROR)


def answers_match(reference: str, value: str) -> bool:
    """Is ``value`` (an answer line's text) equivalent to ``reference``?"""
    from math_verify import verify

    _quiet_math_verify()
    reference, value = str(reference).strip(), str(value).strip()
    gold = _parse(reference) if len(reference) <= 4 * MAX_VALUE_CHARS else ()
    if not gold:  # not mathematics: compare as text
        return reference.casefold() == value.casefold()
    if not single_expression(value):
        return False
    pred = _parse(value)
    if not pred:
        return False
    try:
        return bool(verify(list(gold), list(pred), timeout_seconds=None))
    except Exception as e:
        log.debug("math-verify could not compare %r and %r: %r", reference, value, e)
        return False
