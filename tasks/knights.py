"""Knights and Knaves: generated logic puzzles with exactly one solution, and a strict parser.

Knights always tell the truth, knaves always lie. A puzzle has ``people`` speakers (2..8); each
says one statement, a formula over atoms "X is a knight" / "X is a knave" built with ``not``,
``and``, ``or``, ``iff`` ("if and only if") and ``implies`` ("if ... then ..."), up to
``max_depth`` connectives deep. An assignment is consistent when every speaker's status equals
the truth of their statement; all ``2**people`` assignments are checked and a puzzle is kept
only when exactly one is consistent (otherwise it is redrawn with ``attempt + 1``).

Draws are keyed by ``stable_hash(config, seed, split, index, attempt)``; the split of a puzzle
is a hash bucket of its text (bucket 0 = eval), so no puzzle text is in both splits.

Answer format: the last non-empty line is ``Answer: Ann is a knight, Bob is a knave`` naming
every person exactly once (clauses separated by ``,``, ``;`` or ``and``; ``knight``/``knave``
and names in any case; an optional final full stop). Exactly one ``answer:`` marker may occur
in the completion. Reward: 1.0 for the full correct assignment; ``format_reward`` (documented
format component, default 0.1) for a well-formed but wrong one; 0.0 for anything malformed
(a missing person, a repeated or unknown name, several answers, text after the answer line).

Default difficulty: 2 people, one connective at most, two answer-only worked examples and the
puzzle's names spelled out in the format instruction. Measured with llama.cpp (SmolLM2-135M Q4_1,
temperature 1.0, 64 tokens, 16 train puzzles): mean reward 0.23, 3 of 16 fully correct. With
worked examples that reason before answering, the model rambled past the token limit and scored
0 of 24.
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass
from typing import Any

from tasks.base import (
    MAX_COMPLETION_CHARS, Problem, Split, chat_messages, check_coordinates, config_key, render_prompt as _render_messages, stable_hash,
)

OPERATORS = ("not", "and", "or", "iff", "implies")
NAMES = ("Alice", "Bob", "Carol", "David", "Eve", "Frank", "Grace", "Henry", "Iris", "Jack",
         "Kate", "Liam", "Mona", "Nick", "Olga", "Paul", "Quinn", "Rita", "Sam", "Tina")
MAX_ATTEMPTS = 10_000
"""Redraw limit when looking for a unique-solution puzzle in the requested split."""

Formula = tuple  # ("is", person, knight: bool) | ("not", f) | (op, f, g)


@dataclass(frozen=True)
class KnightsConfig:
    """Difficulty, prompt and reward knobs of :class:`KnightsTask`."""

    min_people: int = 2
    """Fewest people in a puzzle (>= 2)."""
    max_people: int = 2
    """Most people in a puzzle (<= 8)."""
    max_depth: int = 1
    """Most nested connectives in one statement (>= 1: with bare atoms only, flipping every
    person's status keeps all statements consistent, so no puzzle would have one solution)."""
    operators: tuple[str, ...] = OPERATORS
    """Connectives to draw from: any of ``not``, ``and``, ``or``, ``iff``, ``implies``."""
    format_reward: float = 0.1
    """Reward for a well-formed but wrong answer (the format component)."""
    fewshot: int = 2
    """Worked examples shown as earlier chat turns (0..2)."""
    eval_buckets: int = 16
    """Puzzle-text hash buckets; bucket 0 is the eval split."""

    def __post_init__(self) -> None:
        if not (2 <= self.min_people <= self.max_people <= 8):
            raise ValueError("need 2 <= min_people <= max_people <= 8")
        if not (1 <= self.max_depth <= 3):
            raise ValueError("max_depth must be in 1..3")
        bad = [op for op in self.operators if op not in OPERATORS]
        if bad or not self.operators:
            raise ValueError(f"operators must be a non-empty subset of {OPERATORS}, got {self.operators}")
        if not (0.0 <= self.format_reward < 1.0) or self.eval_buckets < 2:
            raise ValueError("need format_reward in [0, 1) and eval_buckets >= 2")
        if not (0 <= self.fewshot <= len(FEWSHOT_EXAMPLES)):
            raise ValueError(f"fewshot must be in 0..{len(FEWSHOT_EXAMPLES)}")


# -- formulas ----------------------------------------------------------------------------------

def evaluate(f: Formula, assignment: tuple[bool, ...]) -> bool:
    """Truth of ``f`` when person i is a knight iff ``assignment[i]``."""
    op = f[0]
    if op == "is":
        return assignment[f[1]] == f[2]
    if op == "not":
        return not evaluate(f[1], assignment)
    a, b = evaluate(f[1], assignment), evaluate(f[2], assignment)
    if op == "and":
        return a and b
    if op == "or":
        return a or b
    if op == "iff":
        return a == b
    if op == "implies":
        return (not a) or b
    raise ValueError(f"unknown operator {op!r}")


def solutions(statements: list[Formula]) -> list[tuple[bool, ...]]:
    """Every consistent assignment (exhaustive over ``2**n``): speaker i is a knight iff statement i holds."""
    n = len(statements)
    return [a for a in itertools.product((True, False), repeat=n)
            if all(a[i] == evaluate(s, a) for i, s in enumerate(statements))]


def random_formula(rng: random.Random, n: int, speaker: int, depth: int, operators: tuple[str, ...]) -> Formula:
    """A random statement by ``speaker`` with up to ``depth`` nested connectives; a bare atom is
    always about someone else, and the two sides of a connective never mention the same single
    person twice (no "X is a knight and X is a knave")."""
    if depth == 0 or not operators or rng.random() < 0.25:
        return ("is", rng.choice([i for i in range(n) if i != speaker]), rng.random() < 0.5)
    return _compound(rng, n, depth, operators)


def _sub(rng: random.Random, n: int, depth: int, operators: tuple[str, ...]) -> Formula:
    if depth == 0 or rng.random() < 0.5:
        return ("is", rng.randrange(n), rng.random() < 0.5)
    return _compound(rng, n, depth, operators)


def _compound(rng: random.Random, n: int, depth: int, operators: tuple[str, ...]) -> Formula:
    op = rng.choice(operators)
    if op == "not":
        return ("not", _sub(rng, n, depth - 1, operators))
    for _ in range(20):
        a, b = _sub(rng, n, depth - 1, operators), _sub(rng, n, depth - 1, operators)
        if a != b and (_person(a) is None or _person(a) != _person(b)):
            return (op, a, b)
    return a


def _person(f: Formula) -> int | None:
    """The person an atom or a negated atom is about; ``None`` for anything else."""
    if f[0] == "not":
        f = f[1]
    return f[1] if f[0] == "is" else None


def render_formula(f: Formula, names: list[str], nested: bool = False) -> str:
    """English text of ``f``; nested compound parts are wrapped in parentheses."""
    op = f[0]
    if op == "is":
        return f"{names[f[1]]} is a {'knight' if f[2] else 'knave'}"
    if op == "not":
        inner = f[1]
        text = (f"{names[inner[1]]} is not a {'knight' if inner[2] else 'knave'}" if inner[0] == "is"
                else f"it is false that {render_formula(inner, names, True)}")
    else:
        a, b = render_formula(f[1], names, True), render_formula(f[2], names, True)
        text = {"and": f"{a} and {b}", "or": f"{a} or {b}", "iff": f"{a} if and only if {b}",
                "implies": f"if {a} then {b}"}[op]
    simple = op == "is" or (op == "not" and f[1][0] == "is")
    return f"({text})" if nested and not simple else text


def puzzle_text(names: list[str], statements: list[Formula]) -> str:
    says = " ".join(f'{names[i]} says: "{render_formula(s, names)[0].upper()}{render_formula(s, names)[1:]}."'
                    for i, s in enumerate(statements))
    return (f"On an island, knights always tell the truth and knaves always lie. "
            f"You meet {len(names)} people: {', '.join(names)}. {says} Who is a knight and who is a knave?")


# -- the strict answer parser ------------------------------------------------------------------

_MARKER = re.compile(r"answer[ \t]*[:=]", re.IGNORECASE)
_CLAUSE = re.compile(r"([A-Za-z]+) is a (knight|knave)", re.IGNORECASE)
_SPLIT = re.compile(r"[ \t]*(?:,[ \t]*and|,|;|\band\b)[ \t]*", re.IGNORECASE)


def parse_assignment(text: str, names: list[str]) -> tuple[bool, ...] | None:
    """The assignment of a well-formed answer (see the module docstring), or ``None``."""
    if not isinstance(text, str) or len(text) > MAX_COMPLETION_CHARS:
        return None
    lines = [ln.strip() for ln in text.strip().splitlines()]
    if not lines or not lines[-1].startswith("Answer:") or len(_MARKER.findall(text)) != 1:
        return None
    body = lines[-1][len("Answer:"):].strip()
    if body.endswith("."):
        body = body[:-1].rstrip()
    index = {n.lower(): i for i, n in enumerate(names)}
    got: dict[int, bool] = {}
    for clause in _SPLIT.split(body):
        m = _CLAUSE.fullmatch(clause)
        if m is None or m.group(1).lower() not in index:
            return None
        i = index[m.group(1).lower()]
        if i in got:
            return None
        got[i] = m.group(2).lower() == "knight"
    if len(got) != len(names):
        return None
    return tuple(got[i] for i in range(len(names)))


def format_answer(names: list[str], assignment: tuple[bool, ...]) -> str:
    return "Answer: " + ", ".join(f"{n} is a {'knight' if k else 'knave'}" for n, k in zip(names, assignment))


SYSTEM_PROMPT = "You are a helpful assistant who solves logic puzzles."
FORMAT_INSTRUCTION = ('Give the final answer on the last line as "Answer: {example}", '
                      'with "knight" or "knave" for each person.')
"""Asks for the strict answer line; ``{example}`` lists the puzzle's names (statuses left open)."""


def format_instruction(names: list[str]) -> str:
    return FORMAT_INSTRUCTION.format(example=", ".join(f"{n} is a ..." for n in names))

FEWSHOT_PUZZLES: tuple[tuple[tuple[str, ...], tuple[Formula, ...], str], ...] = (
    (("Uma", "Vic"), (("is", 1, False), ("or", ("is", 0, True), ("is", 1, True))),
     "Answer: Uma is a knave, Vic is a knight"),
    (("Wes", "Xan"), (("is", 1, True), ("implies", ("is", 0, True), ("is", 1, True))),
     "Answer: Wes is a knight, Xan is a knight"),
)
"""(names, statements, reply) of the worked examples; each has exactly one solution."""

FEWSHOT_EXAMPLES: tuple[tuple[str, str], ...] = tuple(
    (puzzle_text(list(names), list(st)), reply) for names, st, reply in FEWSHOT_PUZZLES)
"""(puzzle, reply); names outside ``NAMES``, so no generated puzzle can equal it."""

PROMPT_KNOBS = ("format_reward", "fewshot")


class KnightsTask:
    """Knights and Knaves puzzles; see the module docstring."""

    name = "knights"

    def __init__(self, config: KnightsConfig | None = None, seed: int = 0) -> None:
        self.config = config or KnightsConfig()
        self.seed = int(seed)
        self._key, self._tag = config_key("knights", self.config, PROMPT_KNOBS)

    def split_of(self, question: str) -> Split:
        return "eval" if stable_hash("knights-split", question) % self.config.eval_buckets == 0 else "train"

    def draw(self, rng: random.Random) -> tuple[list[str], list[Formula], list[tuple[bool, ...]]]:
        """One candidate: names, statements and all consistent assignments."""
        cfg = self.config
        n = rng.randint(cfg.min_people, cfg.max_people)
        names = rng.sample(NAMES, n)
        statements = [random_formula(rng, n, i, cfg.max_depth, cfg.operators) for i in range(n)]
        return names, statements, solutions(statements)

    def problem(self, split: Split, index: int) -> Problem:
        check_coordinates(split, index)
        for attempt in range(MAX_ATTEMPTS):
            rng = random.Random(stable_hash("knights", self._key, self.seed, split, index, attempt))
            names, statements, sols = self.draw(rng)
            if len(sols) != 1:
                continue
            text = puzzle_text(names, statements)
            if self.split_of(text) == split:
                return Problem(id=f"knights-{self._tag}-s{self.seed}-{split}-{index}", question=text,
                               answer=sols[0], data=(tuple(names), tuple(statements)))
        raise RuntimeError("no unique-solution puzzle found for this split")

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        examples = [(f"{question}\n{format_instruction(list(names))}", reply) for (names, _, _), (question, reply)
                    in list(zip(FEWSHOT_PUZZLES, FEWSHOT_EXAMPLES))[:self.config.fewshot]]
        return chat_messages(SYSTEM_PROMPT, examples,
                             f"{problem.question}\n{format_instruction(list(problem.data[0]))}")

    def render_prompt(self, tokenizer: Any, problem: Problem) -> list[int]:
        return _render_messages(tokenizer, self.messages(problem))

    def reward(self, problem: Problem, completion_text: str) -> float:
        names = list(problem.data[0])
        got = parse_assignment(completion_text, names)
        if got is None:
            return 0.0
        return 1.0 if got == tuple(problem.answer) else float(self.config.format_reward)
