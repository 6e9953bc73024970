"""Procedural arithmetic word problems with integer answers.

A problem is a small story about one person and one kind of item: a starting amount followed by
``steps`` events (gets more, gives away, multiplies, shares out), then the question "how many
now?". Everything is derived from ``stable_hash(config, seed, split, index, attempt)``, so a
problem is a pure function of its coordinates.

Disjoint splits by construction: every question text falls in one of ``eval_buckets`` hash
buckets (the hash of the question text alone); bucket 0 is reserved for ``eval`` and the rest for
``train``. A generator draw that lands in the other split's bucket is discarded and redrawn with
``attempt + 1``. So no question string can ever appear in both splits, for any seed.

Default difficulty (measured with llama.cpp, temperature 1.0, 64 train problems): one add or
subtract step (start 2..10, operand 1..10), with two worked examples as earlier chat turns. The
base SmolLM2-135M-Instruct (Q4_1) scores about 0.27-0.31 there (83-84% of completions
well-formed), which leaves GRPO groups with mixed rewards to learn from. Allowing a second step
(``max_steps=2``) dropped it to about 0.05; without the worked examples it almost never writes
the ``Answer:`` line at all (0 of 88 samples over four prompt wordings).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from tasks.base import (
    chat_messages, check_coordinates,
    config_key,
    Problem,
    Split,
    parse_final_answer,
    render_prompt as _render_messages,
    stable_hash,
)

OPERATIONS = ("add", "sub", "mul", "div")

NAMES = ("Tom", "Anna", "Ben", "Lily", "Sam", "Mia", "Jack", "Emma", "Leo", "Zoe",
         "Max", "Nora", "Omar", "Ivy", "Ravi", "Lucy", "Noah", "Ella", "Finn", "Sara")
ITEMS = ("apples", "pencils", "marbles", "stickers", "cookies", "books", "coins", "stamps",
         "shells", "cards", "balloons", "candies", "flowers", "toy cars", "eggs")
FRIENDS = ("a friend", "a neighbour", "a classmate", "a cousin", "a teacher")

# Event phrasings; {n} is the operand, {item} the item, {friend} a recipient.
_ADD = ("Then {name} buys {n} more {item}.", "Then {name} finds {n} more {item}.",
        "Then {name} gets {n} more {item} as a gift.")
_SUB = ("Then {name} gives {n} {item} to {friend}.", "Then {name} loses {n} {item}.",
        "Then {name} uses {n} of the {item}.")
_MUL = ("Then the number of {item} {name} has becomes {n} times as large.",)
_DIV = ("Then {name} splits the {item} into {n} equal piles and keeps only one pile.",)


@dataclass(frozen=True)
class ArithConfig:
    """Difficulty knobs of :class:`ArithTask`."""

    min_value: int = 1
    """Smallest operand of an add/sub step (the starting amount is at least 2)."""
    max_value: int = 10
    """Largest operand of an add/sub step and of the starting amount."""
    min_steps: int = 1
    """Fewest events after the starting amount."""
    max_steps: int = 1
    """Most events after the starting amount."""
    operations: tuple[str, ...] = ("add", "sub")
    """Event kinds to draw from: any of ``add``, ``sub``, ``mul``, ``div``."""
    max_factor: int = 4
    """Largest multiplier/divisor of a ``mul``/``div`` step (smallest is 2)."""
    allow_negative: bool = False
    """If false, a ``sub`` step never takes more than is there (answers stay >= 0)."""
    eval_buckets: int = 16
    """Question-hash buckets; bucket 0 is the eval split (about 1/eval_buckets of all questions)."""
    format_reward: float = 0.0
    """Reward for a well-formed but wrong ``Answer:`` line (0 = pure correctness reward)."""
    fewshot: int = 2
    """Worked examples (from ``FEWSHOT_EXAMPLES``, in order) shown as earlier chat turns."""

    def __post_init__(self) -> None:
        bad = [op for op in self.operations if op not in OPERATIONS]
        if bad or not self.operations:
            raise ValueError(f"operations must be a non-empty subset of {OPERATIONS}, got {self.operations}")
        if not (0 <= self.min_value <= self.max_value):
            raise ValueError("need 0 <= min_value <= max_value")
        if not (1 <= self.min_steps <= self.max_steps):
            raise ValueError("need 1 <= min_steps <= max_steps")
        if self.max_factor < 2 or self.eval_buckets < 2:
            raise ValueError("need max_factor >= 2 and eval_buckets >= 2")
        if not (0 <= self.fewshot <= len(FEWSHOT_EXAMPLES)):
            raise ValueError(f"fewshot must be in 0..{len(FEWSHOT_EXAMPLES)}")
        if not (0.0 <= self.format_reward < 1.0):
            raise ValueError("format_reward must be in [0, 1)")


SYSTEM_PROMPT = "You are a helpful assistant who solves math word problems."
"""System message of every prompt."""

FORMAT_INSTRUCTION = 'Give the final answer on the last line as "Answer: <number>".'
"""Appended to each question; asks for the strict ``Answer: <integer>`` last line."""

# Worked examples in the exact target format. Their names and items are outside NAMES/ITEMS, so
# they never coincide with a generated question. Without them SmolLM2-135M at temperature 1.0
# almost never writes an "Answer:" line (measured: 0/88 samples); with two, about 84% do.
FEWSHOT_EXAMPLES: tuple[tuple[str, str], ...] = (
    ("Kai has 4 kites. Then Kai buys 3 more kites. How many kites does Kai have now?",
     "Kai has 4 + 3 = 7 kites.\nAnswer: 7"),
    ("Rosa has 12 buttons. Then Rosa gives 5 buttons to a friend. How many buttons does Rosa have now?",
     "Rosa has 12 - 5 = 7 buttons.\nAnswer: 7"),
    ("Jun has 6 shirts. Then Jun buys 5 more shirts. Then Jun gives 2 shirts to a cousin. "
     "How many shirts does Jun have now?", "Jun has 6 + 5 = 11 shirts, then 11 - 2 = 9 shirts.\nAnswer: 9"),
)
"""(question, assistant reply) pairs; ``ArithConfig.fewshot`` picks the first k."""

PROMPT_KNOBS = ("fewshot", "format_reward")
"""ArithConfig fields that change prompts or rewards but not the problems."""

MAX_ATTEMPTS = 10_000
"""Redraw limit when looking for a question in the requested split's buckets."""


class ArithTask:
    """Arithmetic word problems; see the module docstring."""

    name = "arith"

    def __init__(self, config: ArithConfig | None = None, seed: int = 0) -> None:
        self.config = config or ArithConfig()
        self.seed = int(seed)
        # Only the knobs that shape questions key the draws: prompt/reward knobs (fewshot,
        # format_reward) leave the problems unchanged.
        self._config_key, self._tag = config_key("arith", self.config, PROMPT_KNOBS)

    # -- problems -------------------------------------------------------------------------
    def split_of(self, question: str) -> Split:
        """The split a question text belongs to (a pure function of the text)."""
        bucket = stable_hash("arith-split", question) % self.config.eval_buckets
        return "eval" if bucket == 0 else "train"

    def problem(self, split: Split, index: int) -> Problem:
        """Problem ``index`` (>= 0) of ``split``; see the module docstring for the guarantees."""
        check_coordinates(split, index)
        for attempt in range(MAX_ATTEMPTS):
            rng = random.Random(stable_hash("arith", self._config_key, self.seed, split, index, attempt))
            question, answer = self._draw(rng)
            if self.split_of(question) == split:
                return Problem(id=f"arith-{self._tag}-s{self.seed}-{split}-{index}", question=question, answer=answer)
        raise RuntimeError("no question found for this split; the problem space is too small")

    def _draw(self, rng: random.Random) -> tuple[str, int]:
        cfg = self.config
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        x = rng.randint(max(cfg.min_value, 2), max(cfg.max_value, 2))  # >= 2: plural nouns
        sentences = [f"{name} has {x} {item}."]
        for _ in range(rng.randint(cfg.min_steps, cfg.max_steps)):
            ops = [op for op in cfg.operations if self._possible(op, x)]
            if not ops:  # e.g. only "sub" with nothing left: fall back to adding
                ops = ["add"]
            op = rng.choice(ops)
            if op == "add":
                n = rng.randint(max(cfg.min_value, 1), max(cfg.max_value, 1))
                x, text = x + n, rng.choice(_ADD)
            elif op == "sub":
                # Without negatives, leave at least one item (an answer of 0 is too guessable).
                hi = cfg.max_value if cfg.allow_negative else min(cfg.max_value, x - 1)
                n = rng.randint(min(max(cfg.min_value, 1), hi), hi)
                x, text = x - n, rng.choice(_SUB)
            elif op == "mul":
                n = rng.randint(2, cfg.max_factor)
                x, text = x * n, rng.choice(_MUL)
            else:  # div: only divisors that leave an integer
                n = rng.choice([d for d in range(2, cfg.max_factor + 1) if x % d == 0])
                x, text = x // n, rng.choice(_DIV)
            sentences.append(text.format(name=name, n=n, item=item, friend=rng.choice(FRIENDS)))
        sentences.append(f"How many {item} does {name} have now?")
        return " ".join(sentences), x

    def _possible(self, op: str, x: int) -> bool:
        if op == "sub":
            return self.config.allow_negative or x >= 2
        if op == "div":
            return x > 0 and any(x % d == 0 for d in range(2, self.config.max_factor + 1))
        return True

    # -- prompts and rewards ----------------------------------------------------------------
    def messages(self, problem: Problem) -> list[dict[str, str]]:
        """System message, ``fewshot`` worked (user, assistant) example turns, then the user
        question; every user turn asks for the strict ``Answer: <integer>`` last line."""
        examples = [(f"{q}\n{FORMAT_INSTRUCTION}", r) for q, r in FEWSHOT_EXAMPLES[:self.config.fewshot]]
        return chat_messages(SYSTEM_PROMPT, examples, f"{problem.question}\n{FORMAT_INSTRUCTION}")

    def render_prompt(self, tokenizer: Any, problem: Problem) -> list[int]:
        """Prompt token ids via ``tokenizer.apply_chat_template(..., add_generation_prompt=True)``."""
        return _render_messages(tokenizer, self.messages(problem))

    def reward(self, problem: Problem, completion_text: str) -> float:
        """1.0 for a correct strict final answer, ``format_reward`` for a well-formed wrong one,
        0.0 otherwise (missing, several, hidden, garbage or oversized answers)."""
        got = parse_final_answer(completion_text)
        if got is None:
            return 0.0
        return 1.0 if got == problem.answer else float(self.config.format_reward)


def render_prompt(tokenizer: Any, problem: Problem, task: ArithTask | None = None) -> list[int]:
    """Module-level convenience: ``(task or ArithTask()).render_prompt(tokenizer, problem)``."""
    return (task or ArithTask()).render_prompt(tokenizer, problem)
