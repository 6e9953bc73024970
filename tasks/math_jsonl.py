"""The ``math`` task: procedural word problems, plus user problems from a GSM8K-form JSONL file.

Without ``data_path`` every problem comes from the procedural generator of :mod:`tasks.arith`
(its knobs are inherited; ``math`` defaults to one or two add/subtract steps, where the base
SmolLM2-135M scored a mean reward of 0.06 on 16 train problems with llama.cpp at temperature
1.0; arithmetic's single step scores about 0.3). With
``data_path``, problems come from the file; ``procedural_fraction`` of the indices (chosen by a
hash of the index) still come from the generator.

File format (GSM8K): one JSON object per line with ``question`` (a non-empty string) and
``answer`` (a string whose last line is ``#### N``, ``N`` an integer, thousands separators
allowed: ``#### 1,234``). A line that breaks this (bad JSON, missing fields, a non-integer
answer such as ``#### 2.5``, an over-long line) is skipped with its line number in a logged
warning; a file without a single valid line is an error.

Splits: with ``eval_data_path`` the eval split is that file and the train split all of
``data_path``; otherwise a question goes to eval when its text hash falls in bucket 0 of
``eval_buckets`` (the same rule as every other task), so no question is in both. Index ``i``
of a split of ``L`` records is record ``perm_e[i % L]`` where ``e = i // L`` and ``perm_e`` is a
seeded permutation per pass, so training runs on for any number of steps.

Completions keep arithmetic's strict shape (the last line ``Answer: <value>``, exactly one answer
marker) but the value is compared with math-verify (:mod:`tasks.math_check`): ``7.0``, ``14/2``,
``\\frac{14}{2}``, ``$7$`` or ``\\boxed{7}`` count as 7, while a list (``3, 7``), words (``7
apples``) or an equation never do. Arithmetic's integer-only check (:func:`tasks.base.parse_final_answer`)
was this task's checker before; ``swarm-bench math-verify`` measures where the two disagree.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from tasks.arith import ArithConfig, ArithTask
from tasks.base import SPLITS, Problem, Split, stable_hash
from tasks.math_check import answers_match, parse_answer_line, single_expression

log = logging.getLogger("echo_swarm.tasks")

MAX_LINE_CHARS = 20_000
"""A JSONL line longer than this is rejected."""

MAX_ANSWER_DIGITS = 12
"""A reference answer with more digits than this is rejected."""

_GSM8K_FINAL = re.compile(r"####[ \t]*(-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+))[ \t]*", re.ASCII)


@dataclass(frozen=True)
class MathRecord:
    """One user problem: the question and its integer answer."""

    question: str
    answer: int


def parse_gsm8k_answer(answer: str) -> int | None:
    """The integer after ``####`` on the last non-empty line of a GSM8K answer, or ``None``."""
    if not isinstance(answer, str):
        return None
    lines = [ln.strip() for ln in answer.strip().splitlines()]
    if not lines:
        return None
    m = _GSM8K_FINAL.fullmatch(lines[-1])
    if m is None:
        return None
    digits = m.group(1).replace(",", "")
    if len(digits.lstrip("-")) > MAX_ANSWER_DIGITS:
        return None
    return int(digits)


def parse_record(line: str) -> MathRecord:
    """One JSONL line -> a record; ``ValueError`` with the reason otherwise."""
    if len(line) > MAX_LINE_CHARS:
        raise ValueError(f"line longer than {MAX_LINE_CHARS} characters")
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    question, answer = obj.get("question"), obj.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise ValueError('missing or empty "question" string')
    if not isinstance(answer, str):
        raise ValueError('missing "answer" string')
    value = parse_gsm8k_answer(answer)
    if value is None:
        raise ValueError('"answer" does not end with "#### <integer>"')
    return MathRecord(question.strip(), value)


def load_jsonl(path: str | Path) -> tuple[list[MathRecord], list[tuple[int, str]]]:
    """(valid records, [(line number, reason)] of skipped lines); blank lines are ignored."""
    records: list[MathRecord] = []
    rejected: list[tuple[int, str]] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(parse_record(line))
            except ValueError as e:
                rejected.append((no, str(e)))
    return records, rejected


@functools.lru_cache(maxsize=8)
def _load_checked(path: str) -> tuple[MathRecord, ...]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"math data file not found: {p}")
    records, rejected = load_jsonl(p)
    if rejected:
        shown = "; ".join(f"line {n}: {why}" for n, why in rejected[:5])
        log.warning("%s: skipped %d malformed line(s): %s%s", p, len(rejected), shown, " ..." if len(rejected) > 5 else "")
    if not records:
        raise ValueError(f"{p}: no valid GSM8K-form line (question + answer ending in '#### N')")
    return tuple(records)


@dataclass(frozen=True)
class MathConfig(ArithConfig):
    """Procedural knobs (inherited from :class:`ArithConfig`) plus the optional user data."""

    max_steps: int = 2
    """Most events per procedural problem (math allows two; arith one)."""
    data_path: str = ""
    """GSM8K-form JSONL file of user problems ("" = procedural problems only)."""
    eval_data_path: str = ""
    """Optional separate JSONL file for the eval split ("" = a hash split of ``data_path``)."""
    procedural_fraction: float = 0.0
    """With ``data_path``: the fraction of problem indices taken from the generator instead."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (0.0 <= self.procedural_fraction <= 1.0):
            raise ValueError("procedural_fraction must be in [0, 1]")
        if self.eval_data_path and not self.data_path:
            raise ValueError("eval_data_path needs data_path")


class MathTask:
    """Procedural and user math problems; see the module docstring."""

    name = "math"

    def __init__(self, config: MathConfig | None = None, seed: int = 0) -> None:
        self.config = config or MathConfig()
        self.seed = int(seed)
        arith_fields = {f.name for f in fields(ArithConfig)}
        self._arith = ArithTask(ArithConfig(**{k: v for k, v in asdict(self.config).items() if k in arith_fields}), seed)
        self._splits: dict[str, tuple[MathRecord, ...]] = {}
        if self.config.data_path:
            train = _load_checked(self.config.data_path)
            if self.config.eval_data_path:
                self._splits = {"train": train, "eval": _load_checked(self.config.eval_data_path)}
            else:
                self._splits = {s: tuple(r for r in train if self.split_of(r.question) == s) for s in SPLITS}
            for s in SPLITS:
                if not self._splits[s]:
                    raise ValueError(f"math data: the {s} split is empty (too few valid lines for a hash split; "
                                     "give eval_data_path or more lines)")

    def split_of(self, question: str) -> Split:
        return "eval" if stable_hash("math-split", question) % self.config.eval_buckets == 0 else "train"

    def _procedural(self, index: int) -> bool:
        frac = self.config.procedural_fraction
        return not self._splits or (frac > 0 and stable_hash("math-mix", self.seed, index) % 10_000 < frac * 10_000)

    @functools.lru_cache(maxsize=64)
    def _perm(self, split: str, epoch: int) -> tuple[int, ...]:
        order = list(range(len(self._splits[split])))
        random.Random(stable_hash("math-perm", self.seed, split, epoch)).shuffle(order)
        return tuple(order)

    def problem(self, split: Split, index: int) -> Problem:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if index < 0:
            raise ValueError("index must be >= 0")
        if self._procedural(index):
            p = self._arith.problem(split, index)
            return Problem(id=f"math-{p.id}", question=p.question, answer=p.answer)
        records = self._splits[split]
        rec = records[self._perm(split, index // len(records))[index % len(records)]]
        return Problem(id=f"math-data-s{self.seed}-{split}-{index}", question=rec.question, answer=rec.answer)

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        return self._arith.messages(problem)

    def render_prompt(self, tokenizer: Any, problem: Problem) -> list[int]:
        return self._arith.render_prompt(tokenizer, problem)

    def reward(self, problem: Problem, completion_text: str) -> float:
        """1.0 when the answer line's value equals the reference (math-verify), ``format_reward``
        for a well-formed single-expression wrong one, 0.0 otherwise."""
        value = parse_answer_line(completion_text)
        if value is None or not single_expression(value):
            return 0.0
        return 1.0 if answers_match(str(problem.answer), value) else float(self.config.format_reward)
