"""``data``: prompts and reference answers from a local file or a Hugging Face dataset, and rewards.

``path`` is a local ``.jsonl``/``.json``, ``.parquet`` or ``.csv`` file (read with ``datasets``'
local builders), or a dataset on the Hugging Face Hub by name (``org/name``): its snapshot at
``revision`` (a branch, tag or commit) comes from the Hub cache through ``huggingface_hub``
(downloaded once; ``HF_HUB_OFFLINE=1`` reads the cache alone) and is loaded as a local dataset
directory, ``datasets.load_dataset(snapshot, subset, split=train_split)`` (its README's configs
and the Hub's split file names apply).
``prompt_column`` and ``answer_column`` name the columns; rows with an empty prompt are skipped
(logged). A prompt is a string, or a list of chat messages (``{"role", "content"}``: a
conversational dataset, as TRL's).

Splits, with a fixed seed (``split_seed``):

- ``eval_split`` (a Hub dataset's split, e.g. ``test``): its rows are the eval split;
- ``split_column`` + ``eval_value``: rows whose ``split_column`` equals ``eval_value`` are the
  eval split, the rest train; a prompt found in both is kept in eval only;
- otherwise ``eval_fraction`` of the distinct prompts (a seeded shuffle) are eval, the rest
  train; identical prompts stay together, so no prompt is in both splits.

Problem ``i`` of a split of ``L`` prompts is ``perm_e[i % L]`` of pass ``e = i // L`` (a seeded
permutation per pass), so training runs on for any number of steps.

Prompts: ``system_prompt``, then the user turn ``prompt`` followed by ``instruction``, through
the model's chat template (a conversational prompt keeps its own messages; ``system_prompt`` is
added only when it has no system message). Rewards (``reward``, one name or a list, weighted
by ``reward_weights``; :mod:`tasks.rewards`):

- ``"math"`` (default): the last non-empty line must be ``Answer: <value>`` with exactly one
  answer marker in the completion (the strict rule of :mod:`tasks.base`), and the value is
  compared with the reference by math-verify (:mod:`tasks.math_check`: fractions, decimals,
  LaTeX and equivalent forms);
- ``"exact"``: the same line, compared as text after trimming whitespace;
- ``"package.module:function"`` or ``"file.py:function"``: a reward function of the user's in
  TRL's batch form or verifiers' keyword form (:mod:`tasks.rewards`), given every column of
  the row. Each is called once on the first training example when the task is built.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from tasks.base import Problem, Split, chat_messages, check_coordinates, render_prompt, stable_hash
from tasks.math_check import answers_match, parse_answer_line
from tasks.rewards import Example, RewardFn, RewardSet, load_reward, parse_reward_specs, reward_form

log = logging.getLogger("echo_swarm.tasks")

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
"""File suffix -> ``datasets`` builder."""

HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+", re.ASCII)
"""A Hub repository id, ``org/name``."""

DEFAULT_INSTRUCTION = 'Give the final answer on the last line as "Answer: <answer>".'
"""Appended to each prompt for the ``math`` and ``exact`` rewards."""

SPLIT_KEY = "\x00split"
"""Key under which :func:`read_rows` marks the rows of a Hub dataset's ``eval_split``."""


@dataclass(frozen=True)
class DataConfig:
    """Knobs of :class:`DataTask` (``task.options`` of ``task.name = "data"``)."""

    path: str = ""
    """Local ``.jsonl``/``.json``, ``.parquet`` or ``.csv`` file, or a Hub dataset ``org/name`` (required)."""
    prompt_column: str = "prompt"
    """Column holding the prompt (the user turn, or a list of chat messages)."""
    answer_column: str = "answer"
    """Column holding the reference answer (turned into a string)."""
    split_column: str = ""
    """Column that names each row's split ("" = split by ``eval_fraction``)."""
    eval_value: str = "test"
    """With ``split_column``: the value that marks an eval row (compared as text)."""
    eval_fraction: float = 0.1
    """Without ``split_column`` or ``eval_split``: the fraction of distinct prompts held out for eval."""
    split_seed: int = 0
    """Seed of the fraction split (fixed: the same file always splits the same way)."""
    reward: str | tuple[str, ...] = "math"
    """``math``, ``exact``, ``package.module:function`` or ``file.py:function``, or a list of them."""
    reward_weights: tuple[float, ...] = ()
    """One weight per reward (default: all 1.0); the reward is the weighted sum."""
    system_prompt: str = "You are a helpful assistant."
    """System message of every prompt."""
    instruction: str = DEFAULT_INSTRUCTION
    """Text appended to every prompt (on its own line; "" = none)."""
    revision: str = ""
    """Hub dataset: the branch, tag or commit to load ("" = the default branch)."""
    subset: str = ""
    """Hub dataset: its configuration name ("" = the default one)."""
    train_split: str = "train"
    """Hub dataset: the split that holds the training rows."""
    eval_split: str = ""
    """Hub dataset: a split whose rows are the eval split ("" = ``split_column`` or ``eval_fraction``)."""

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("task.options.path: the data file is required for task 'data'")
        if not is_hub_name(self.path) and Path(self.path).suffix.lower() not in FORMATS:
            raise ValueError(f"task.options.path {self.path!r}: use a {', '.join(FORMATS)} file or a Hub "
                             "dataset name (org/name)")
        if not (0.0 < self.eval_fraction < 1.0):
            raise ValueError("task.options.eval_fraction must be in (0, 1)")
        if not self.prompt_column or not self.answer_column:
            raise ValueError("task.options.prompt_column and answer_column must be non-empty")
        if self.eval_split and self.split_column:
            raise ValueError("task.options: give eval_split or split_column, not both")
        if (self.eval_split or self.revision or self.subset) and not is_hub_name(self.path):
            raise ValueError("task.options.eval_split, revision and subset apply to a Hub dataset (path = 'org/name')")
        parse_reward_specs(self.reward, self.reward_weights)


def is_hub_name(path: str) -> bool:
    """Whether ``path`` names a Hub dataset: ``org/name`` that is not a local file or directory."""
    return bool(HUB_NAME.fullmatch(path)) and not Path(path).expanduser().exists() \
        and Path(path).suffix.lower() not in FORMATS


@dataclass(frozen=True)
class Record:
    prompt: str
    """The prompt's text (a conversational prompt: its messages as JSON)."""
    answer: str
    row: int = -1
    """Index of the row in the table (its columns reach the rewards)."""
    split: str = ""
    """``eval`` for a row of a Hub dataset's ``eval_split``."""


def _load(cfg: DataConfig, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    import datasets

    datasets.disable_progress_bars()
    if not is_hub_name(cfg.path):
        p = Path(cfg.path).expanduser()
        if not p.is_file():
            raise FileNotFoundError(f"data file not found: {p} (a Hub dataset is named org/name)")
        try:
            ds = datasets.load_dataset(FORMATS[p.suffix.lower()], data_files=str(p), split="train")
        except Exception as e:  # a malformed file: say which and why
            raise ValueError(f"{p}: cannot read it as {FORMATS[p.suffix.lower()]}: {type(e).__name__}: {e}") from None
        tables = [(ds, "")]
    else:
        local = hub_dataset_dir(cfg.path, cfg.revision)
        splits = [(cfg.train_split, "")] + ([(cfg.eval_split, "eval")] if cfg.eval_split else [])
        tables = []
        for split, mark in splits:
            try:
                ds = datasets.load_dataset(str(local), cfg.subset or None, split=split)
            except Exception as e:  # not in the cache offline, no such split, no such dataset: say which
                raise ValueError(f"Hub dataset {cfg.path!r} (revision {cfg.revision or 'default'}, split {split!r}): "
                                 f"cannot load it: {type(e).__name__}: {e}") from None
            tables.append((ds, mark))
    rows: list[dict[str, Any]] = []
    for ds, mark in tables:
        missing = [c for c in columns if c and c not in ds.column_names]
        if missing:
            raise ValueError(f"{cfg.path}: no column(s) {missing}; columns: {ds.column_names}")
        rows += [{**r, SPLIT_KEY: mark} if mark else r for r in ds.to_list()]
    return rows


def hub_dataset_dir(name: str, revision: str = "") -> Path:
    """The snapshot directory of Hub dataset ``name`` at ``revision`` (``huggingface_hub``: fetched
    once into the Hub cache, or found there; ``HF_HUB_OFFLINE=1`` reads the cache alone). It is
    then read as a local dataset directory: its README's configs and the Hub's split file names."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, repo_type="dataset", revision=revision or None))
    except Exception as e:
        raise ValueError(f"Hub dataset {name!r} (revision {revision or 'main'}): cannot resolve it: "
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} (offline, only the Hub "
                         "cache is read)") from None


def read_rows(cfg: DataConfig) -> list[dict[str, Any]]:
    """Every row of the task's file or Hub dataset (all columns); errors name the source."""
    return _load(cfg, (cfg.prompt_column, cfg.answer_column, cfg.split_column))


def prompt_key(prompt: Any) -> str | None:
    """The text identity of a prompt: a non-empty string, or chat messages as JSON; ``None``
    when it is neither."""
    if isinstance(prompt, str):
        return prompt.strip() or None
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                   and m.get("role") in ("system", "user", "assistant")
                                                   for m in prompt):
        return json.dumps([{"role": m["role"], "content": m["content"]} for m in prompt], sort_keys=True)
    return None


def split_records(rows: list[dict[str, Any]], cfg: DataConfig) -> dict[str, tuple[Record, ...]]:
    """Train and eval records of ``rows`` (the module docstring's rules); a pure function."""
    records, eval_prompts = [], set()
    skipped = 0
    for i, row in enumerate(rows):
        prompt, answer = prompt_key(row.get(cfg.prompt_column)), row.get(cfg.answer_column)
        if prompt is None or answer is None:
            skipped += 1
            continue
        rec = Record(prompt, str(answer).strip(), i, str(row.get(SPLIT_KEY, "")))
        records.append(rec)
        if rec.split == "eval" or cfg.split_column and str(row.get(cfg.split_column)) == cfg.eval_value:
            eval_prompts.add(rec.prompt)
    if skipped:
        log.warning("%s: skipped %d row(s) without a prompt or an answer", cfg.path, skipped)
    if not cfg.split_column and not cfg.eval_split:
        distinct = sorted({r.prompt for r in records})
        random.Random(stable_hash("data-split", cfg.split_seed)).shuffle(distinct)
        eval_prompts = set(distinct[:max(1, round(cfg.eval_fraction * len(distinct)))])
    out = {"train": tuple(r for r in records if r.prompt not in eval_prompts),
           "eval": tuple(r for r in records if r.prompt in eval_prompts)}
    for split, recs in out.items():
        if not recs:
            raise ValueError(f"{cfg.path}: the {split} split is empty ({len(records)} usable rows)")
    return out


def math_reward(completion: str, answer: str) -> float:
    """The built-in ``math`` reward (module docstring)."""
    got = parse_answer_line(completion)
    return 1.0 if got is not None and answers_match(answer, got) else 0.0


def exact_reward(completion: str, answer: str) -> float:
    """The built-in ``exact`` reward (module docstring)."""
    got = parse_answer_line(completion)
    return 1.0 if got is not None and got == answer.strip() else 0.0


BUILTIN_REWARDS = {"math": math_reward, "exact": exact_reward}


def build_rewards(cfg: DataConfig, columns: Sequence[str]) -> RewardSet:
    fns = []
    for name, weight in parse_reward_specs(cfg.reward, cfg.reward_weights):
        if name in BUILTIN_REWARDS:
            fn = BUILTIN_REWARDS[name]
            fns.append(RewardFn(name, fn, weight, reward_form(fn, name)))
        else:
            fns.append(load_reward(name, weight))
    return RewardSet(fns, columns)


class DataTask:
    """Prompts and answers from a file or a Hub dataset, scored by ``reward`` (module docstring)."""

    name = "data"

    def __init__(self, config: DataConfig, seed: int = 0) -> None:
        self.config = config
        self.seed = int(seed)
        self._rows = tuple(read_rows(config))
        self._splits = split_records(list(self._rows), config)
        self._rewards = build_rewards(config, [c for c in self._rows[0] if c != SPLIT_KEY])
        first = self.problem("train", 0)
        self._rewards.validate(self.example(first), f"Answer: {first.answer}")

    @functools.lru_cache(maxsize=64)
    def _perm(self, split: str, epoch: int) -> tuple[int, ...]:
        order = list(range(len(self._splits[split])))
        random.Random(stable_hash("data-perm", self.seed, split, epoch)).shuffle(order)
        return tuple(order)

    def problem(self, split: Split, index: int) -> Problem:
        check_coordinates(split, index)
        recs = self._splits[split]
        rec = recs[self._perm(split, index // len(recs))[index % len(recs)]]
        question = rec.prompt
        if not isinstance(self._rows[rec.row].get(self.config.prompt_column), str):  # conversational
            question = next((m["content"] for m in reversed(json.loads(rec.prompt)) if m["role"] == "user"), "")
        return Problem(id=f"data-s{self.seed}-{split}-{index}", question=question, answer=rec.answer, data=rec.row)

    def _row(self, problem: Problem) -> dict[str, Any]:
        if not isinstance(problem.data, int) or not (0 <= problem.data < len(self._rows)):
            raise ValueError(f"problem {problem.id}: not a row of this task")
        return self._rows[problem.data]

    def example(self, problem: Problem) -> Example:
        """The problem as its rewards see it (prompt, answer, the row's columns)."""
        row = self._row(problem)
        prompt = row[self.config.prompt_column]
        conversational = not isinstance(prompt, str)
        return Example(prompt if conversational else prompt.strip(), problem.answer,
                       {k: v for k, v in row.items() if k != SPLIT_KEY}, conversational)

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        suffix = f"\n{self.config.instruction}" if self.config.instruction else ""
        prompt = self._row(problem)[self.config.prompt_column]
        if isinstance(prompt, str):
            return chat_messages(self.config.system_prompt, (), problem.question + suffix)
        msgs = [{"role": m["role"], "content": m["content"]} for m in prompt]
        if self.config.system_prompt and not any(m["role"] == "system" for m in msgs):
            msgs.insert(0, {"role": "system", "content": self.config.system_prompt})
        last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user") if any(
            m["role"] == "user" for m in msgs) else None
        if last_user is not None and suffix:
            msgs[last_user] = {"role": "user", "content": msgs[last_user]["content"] + suffix}
        return msgs

    def render_prompt(self, tokenizer: Any, problem: Problem) -> list[int]:
        return render_prompt(tokenizer, self.messages(problem))

    def score_group(self, problem: Problem, texts: Sequence[str],
                    completion_ids: Sequence[Sequence[int]] | None = None) -> list[float]:
        """The rewards of a group's completions (``NaN``: no reward, logged; :mod:`tasks.rewards`)."""
        return self._rewards.score(self.example(problem), texts, completion_ids, where=problem.id)

    def reward(self, problem: Problem, completion_text: str) -> float:
        return self.score_group(problem, [completion_text])[0]
