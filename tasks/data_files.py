"""``data``: prompts and reference answers from a local JSONL, Parquet or CSV file, and a reward.

The file is read once with ``datasets`` (its local ``json``/``parquet``/``csv`` builders, with
``HF_DATASETS_OFFLINE=1``: nothing is downloaded; a path that is not an existing local file is
an error). ``prompt_column`` and ``answer_column`` name the columns; rows with an empty prompt
are skipped (logged).

Splits, with a fixed seed (``split_seed``):

- ``split_column`` + ``eval_value``: rows whose ``split_column`` equals ``eval_value`` are the
  eval split, the rest train; a prompt found in both is kept in eval only;
- otherwise ``eval_fraction`` of the distinct prompts (a seeded shuffle) are eval, the rest
  train; identical prompts stay together, so no prompt is in both splits.

Problem ``i`` of a split of ``L`` prompts is ``perm_e[i % L]`` of pass ``e = i // L`` (a seeded
permutation per pass), so training runs on for any number of steps.

Prompts: ``system_prompt``, then the user turn ``prompt`` followed by ``instruction``, through
the model's chat template. Rewards (``reward``):

- ``"math"`` (default): the last non-empty line must be ``Answer: <value>`` with exactly one
  answer marker in the completion (the strict rule of :mod:`tasks.base`), and the value is
  compared with the reference by math-verify (:mod:`tasks.math_check`: fractions, decimals,
  LaTeX and equivalent forms);
- ``"exact"``: the same line, compared as text after trimming whitespace;
- ``"package.module:function"``: a reward callable of the user's,
  ``function(completion: str, answer: str, prompt: str) -> float`` in [0, 1]; it sees the whole
  completion text. One that raises or returns a non-number scores 0 (logged).
"""

from __future__ import annotations

import functools
import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.base import Problem, Split, chat_messages, check_coordinates, render_prompt, stable_hash
from tasks.math_check import answers_match, parse_answer_line
from tasks.plugins import resolve_attr, safe_score

log = logging.getLogger("echo_swarm.tasks")

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
"""File suffix -> ``datasets`` builder."""

DEFAULT_INSTRUCTION = 'Give the final answer on the last line as "Answer: <answer>".'
"""Appended to each prompt for the ``math`` and ``exact`` rewards."""


@dataclass(frozen=True)
class DataConfig:
    """Knobs of :class:`DataTask` (``task.options`` of ``task.name = "data"``)."""

    path: str = ""
    """Local ``.jsonl``/``.json``, ``.parquet`` or ``.csv`` file (required)."""
    prompt_column: str = "prompt"
    """Column holding the prompt (the user turn)."""
    answer_column: str = "answer"
    """Column holding the reference answer (turned into a string)."""
    split_column: str = ""
    """Column that names each row's split ("" = split by ``eval_fraction``)."""
    eval_value: str = "test"
    """With ``split_column``: the value that marks an eval row (compared as text)."""
    eval_fraction: float = 0.1
    """Without ``split_column``: the fraction of distinct prompts held out for eval."""
    split_seed: int = 0
    """Seed of the fraction split (fixed: the same file always splits the same way)."""
    reward: str = "math"
    """``math``, ``exact``, or ``package.module:function`` (module docstring)."""
    system_prompt: str = "You are a helpful assistant."
    """System message of every prompt."""
    instruction: str = DEFAULT_INSTRUCTION
    """Text appended to every prompt (on its own line; "" = none)."""

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("task.options.path: the data file is required for task 'data'")
        if Path(self.path).suffix.lower() not in FORMATS:
            raise ValueError(f"task.options.path {self.path!r}: use a {', '.join(FORMATS)} file")
        if not (0.0 < self.eval_fraction < 1.0):
            raise ValueError("task.options.eval_fraction must be in (0, 1)")
        if not self.prompt_column or not self.answer_column:
            raise ValueError("task.options.prompt_column and answer_column must be non-empty")


@dataclass(frozen=True)
class Record:
    prompt: str
    answer: str


def read_rows(path: str, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    """The rows of a local data file (only ``columns``) through ``datasets``; errors name the file."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"data file not found (only local files are read): {p}")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    try:
        ds = datasets.load_dataset(FORMATS[p.suffix.lower()], data_files=str(p), split="train")
    except Exception as e:  # a malformed file: say which and why
        raise ValueError(f"{p}: cannot read it as {FORMATS[p.suffix.lower()]}: {type(e).__name__}: {e}") from None
    missing = [c for c in columns if c and c not in ds.column_names]
    if missing:
        raise ValueError(f"{p}: no column(s) {missing}; columns: {ds.column_names}")
    return ds.select_columns([c for c in columns if c]).to_list()


def split_records(rows: list[dict[str, Any]], cfg: DataConfig) -> dict[str, tuple[Record, ...]]:
    """Train and eval records of ``rows`` (the module docstring's rules); a pure function."""
    records, eval_prompts = [], set()
    skipped = 0
    for row in rows:
        prompt, answer = row.get(cfg.prompt_column), row.get(cfg.answer_column)
        if not isinstance(prompt, str) or not prompt.strip() or answer is None:
            skipped += 1
            continue
        rec = Record(prompt.strip(), str(answer).strip())
        records.append(rec)
        if cfg.split_column and str(row.get(cfg.split_column)) == cfg.eval_value:
            eval_prompts.add(rec.prompt)
    if skipped:
        log.warning("%s: skipped %d row(s) without a prompt or an answer", cfg.path, skipped)
    if not cfg.split_column:
        distinct = sorted({r.prompt for r in records})
        random.Random(stable_hash("data-split", cfg.split_seed)).shuffle(distinct)
        eval_prompts = set(distinct[:max(1, round(cfg.eval_fraction * len(distinct)))])
    out = {"train": tuple(r for r in records if r.prompt not in eval_prompts),
           "eval": tuple(r for r in records if r.prompt in eval_prompts)}
    for split, recs in out.items():
        if not recs:
            raise ValueError(f"{cfg.path}: the {split} split is empty ({len(records)} usable rows)")
    return out


class DataTask:
    """Prompts and answers from a file, scored by ``reward`` (module docstring)."""

    name = "data"

    def __init__(self, config: DataConfig, seed: int = 0) -> None:
        self.config = config
        self.seed = int(seed)
        rows = read_rows(config.path, (config.prompt_column, config.answer_column, config.split_column))
        self._splits = split_records(rows, config)
        self._user_reward = None
        if config.reward not in ("math", "exact"):
            self._user_reward = resolve_attr(config.reward, "reward function")

    @functools.lru_cache(maxsize=64)
    def _perm(self, split: str, epoch: int) -> tuple[int, ...]:
        order = list(range(len(self._splits[split])))
        random.Random(stable_hash("data-perm", self.seed, split, epoch)).shuffle(order)
        return tuple(order)

    def problem(self, split: Split, index: int) -> Problem:
        check_coordinates(split, index)
        recs = self._splits[split]
        rec = recs[self._perm(split, index // len(recs))[index % len(recs)]]
        return Problem(id=f"data-s{self.seed}-{split}-{index}", question=rec.prompt, answer=rec.answer)

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        user = problem.question + (f"\n{self.config.instruction}" if self.config.instruction else "")
        return chat_messages(self.config.system_prompt, (), user)

    def render_prompt(self, tokenizer: Any, problem: Problem) -> list[int]:
        return render_prompt(tokenizer, self.messages(problem))

    def reward(self, problem: Problem, completion_text: str) -> float:
        if self._user_reward is not None:
            try:
                value = self._user_reward(completion_text, problem.answer, problem.question)
            except Exception as e:  # user code: log it, never stop the learner
                log.warning("reward %s raised %r on %s: scored 0.0", self.config.reward, e, problem.id)
                return 0.0
            return safe_score(value, f"reward {self.config.reward}")
        got = parse_answer_line(completion_text)
        if got is None:
            return 0.0
        if self.config.reward == "exact":
            return 1.0 if got == problem.answer.strip() else 0.0
        return 1.0 if answers_match(problem.answer, got) else 0.0
