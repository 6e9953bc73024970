"""What every task shares: the problem record, the task interface, the strict answer parser.

A task is a deterministic, infinite-on-demand source of problems with verifiable rewards. Both
sides import it: nodes render prompts from it, the learner recomputes every reward from the
completion text (it never trusts a reward a node reports).

The final-answer format is deliberately strict (see :func:`parse_final_answer`): the last
non-empty line must be ``Answer: <integer>`` and nothing else in the completion may look like a
second answer. A model that sometimes answers in this format learns it quickly under GRPO, and
a strict parser leaves no room for reward hacking by listing several candidate answers.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Literal, Sequence

Split = Literal["train", "eval"]
SPLITS: tuple[str, ...] = ("train", "eval")

ANSWER_PREFIX = "Answer:"
"""The literal that opens the final-answer line."""

MAX_COMPLETION_CHARS = 4000
"""Completions longer than this (in characters) score 0 without being parsed."""

MAX_ANSWER_DIGITS = 12
"""An answer with more digits than this is treated as garbage (scores 0)."""

# The last non-empty line: "Answer:", optional spaces, optional minus, ASCII digits, an optional
# trailing full stop. re.ASCII keeps \s and friends ASCII-only; digits are spelled [0-9] so that
# Unicode digits (e.g. Arabic-Indic, fullwidth) never parse.
_FINAL_LINE = re.compile(r"Answer:[ \t]*(-?[0-9]{1,%d})[ \t]*\.?" % MAX_ANSWER_DIGITS, re.ASCII)
# Anything that looks like an answer marker, anywhere (case-insensitive): "answer:", "Answer =",
# "ANSWER :" ... Exactly one may occur, on the last line.
_ANY_MARKER = re.compile(r"answer[ \t]*[:=]", re.IGNORECASE)


@dataclass(frozen=True)
class Problem:
    """One problem instance. ``id`` is unique per (task config, seed, split, index)."""

    id: str
    question: str
    answer: Any
    """The reference answer: an ``int`` for arithmetic and math, a tuple of booleans (knight =
    True) for Knights and Knaves, the optimal number of moves for Sokoban."""
    data: Any = None
    """Task-specific payload a reward needs besides ``answer`` (e.g. a Sokoban level's rows);
    immutable (tuples), so problems stay hashable and comparable."""


def parse_final_answer(text: str) -> int | None:
    """Return the integer of a well-formed final answer, or ``None``.

    Well-formed means all of:
    - ``len(text) <= MAX_COMPLETION_CHARS``;
    - the last non-empty line, stripped, is exactly ``Answer: N`` (``N`` = optional ``-`` and
      1..MAX_ANSWER_DIGITS ASCII digits, an optional trailing ``.``);
    - no other answer marker (``answer:`` / ``answer =``, any case) occurs anywhere else, so
      several answers (even equal ones), an answer hidden earlier in the reasoning, or text
      after the answer line all give ``None``.
    """
    if not isinstance(text, str) or len(text) > MAX_COMPLETION_CHARS:
        return None
    lines = [ln.strip() for ln in text.strip().splitlines()]
    if not lines or not lines[-1]:
        return None
    m = _FINAL_LINE.fullmatch(lines[-1])
    if m is None:
        return None
    if len(_ANY_MARKER.findall(text)) != 1:
        return None
    return int(m.group(1))


def stable_hash(*parts: Any) -> int:
    """A 64-bit hash of ``parts`` that is stable across processes and Python versions."""
    h = hashlib.sha256("\x1f".join(repr(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big")


#: Task setting for chat templates with a thinking mode (Qwen3's ``enable_thinking``): off, so an
#: answer starts right after an empty thinking block instead of a long reasoning trace that
#: the tasks' completion budgets would cut. Templates without the switch are not affected.
ENABLE_THINKING = False


def template_kwargs(tokenizer: Any, enable_thinking: bool = ENABLE_THINKING) -> dict[str, Any]:
    """Extra ``apply_chat_template`` arguments for ``tokenizer``'s own template:
    ``{"enable_thinking": ...}`` when the template reads that variable, else nothing."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and "enable_thinking" in template:
        return {"enable_thinking": bool(enable_thinking)}
    return {}


def render_prompt(tokenizer: Any, messages: Sequence[dict[str, str]], enable_thinking: bool = ENABLE_THINKING) -> list[int]:
    """Token ids of ``messages`` rendered with the tokenizer's chat template, ending with the
    generation prompt of the assistant turn (``add_generation_prompt=True``); thinking
    templates get ``enable_thinking`` (:func:`template_kwargs`)."""
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True,
                                         **template_kwargs(tokenizer, enable_thinking))
    # The template already contains any BOS/special tokens it wants; do not add more.
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return [int(t) for t in ids]


def config_key(name: str, config: Any, prompt_knobs: tuple[str, ...]) -> tuple[tuple, str]:
    """``(key, tag)`` of a task config: the sorted fields that shape problems (prompt/reward
    knobs leave problems unchanged, so they are left out) and an 8-hex-digit tag of them."""
    from dataclasses import asdict

    key = tuple(sorted((k, v) for k, v in asdict(config).items() if k not in prompt_knobs))
    return key, "%08x" % (stable_hash(f"{name}-config", key) & 0xFFFFFFFF)


def chat_messages(system: str, examples: Any, question: str) -> list[dict[str, str]]:
    """System message, worked ``(user, assistant)`` example turns, then the user question."""
    msgs = [{"role": "system", "content": system}]
    for user, reply in examples:
        msgs.append({"role": "user", "content": user})
        msgs.append({"role": "assistant", "content": reply})
    msgs.append({"role": "user", "content": question})
    return msgs


def check_coordinates(split: str, index: int) -> None:
    """Raise ``ValueError`` unless ``split`` is a known split and ``index >= 0``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if index < 0:
        raise ValueError("index must be >= 0")
