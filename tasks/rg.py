"""``rg:<dataset>``: a reasoning-gym procedural generator as a single-turn task.

``task.options`` holds the dataset's own config fields (those of its reasoning-gym config
dataclass, e.g. ``min_terms`` for ``basic_arithmetic``) and this adapter's knobs
(:class:`RGKnobs`: ``fewshot``, ``eval_buckets``, ``system_prompt``); an unknown key is an error
naming the dataset's fields. ``seed`` and ``size`` are the adapter's to set.

Problems: reasoning-gym builds item ``idx`` from ``Random(dataset.seed + idx)`` alone. Problem
``i`` of a split draws ``idx = stable_hash(dataset, options, seed, split, i, attempt)`` (63 bits,
dataset seed 0), and, as in every task here, the question text's hash bucket decides its split:
bucket 0 of ``eval_buckets`` is eval, the rest train; a draw in the other split's bucket is
redrawn with ``attempt + 1``. So no question string is ever in both splits, for any seed, even
for datasets whose problem space is small.

Prompts: the system prompt asks for the final answer between ``<answer>`` tags (reasoning-gym's
own answer convention); ``fewshot`` worked examples are earlier chat turns, each a train-split
question of the same dataset (drawn from indices no training problem uses) answered with its
reference answer in tags. The prompt is rendered with the model's chat template.

Reward: the text of the last ``<answer>...</answer>`` pair (reasoning-gym's ``extract_answer``)
scored by the dataset's own ``score_answer`` against the regenerated item; no tags gives
``score_answer(None, item)`` (0 in every dataset we know of). A scorer that raises scores 0,
logged.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from typing import Any

from tasks.base import Problem, Split, chat_messages, check_coordinates, render_prompt, stable_hash
from tasks.plugins import TaskNotInstalled, safe_score

log = logging.getLogger("echo_swarm.tasks")

DEFAULT_SYSTEM_PROMPT = ("Solve the problem. Think briefly, then give the final answer between <answer> and "
                         "</answer> tags, with nothing else inside the tags.")
"""System message of every prompt (``system_prompt`` replaces it)."""

MAX_ATTEMPTS = 1000
"""Redraw limit when looking for a question in the requested split's buckets."""

FEWSHOT_BASE = 1 << 40
"""Worked examples are train problems at indices ``FEWSHOT_BASE + k``: no run reaches them."""

RESERVED = ("seed", "size")
"""reasoning-gym config fields the adapter sets itself."""


@dataclass(frozen=True)
class RGKnobs:
    """The adapter's own options (the rest of ``task.options`` goes to reasoning-gym)."""

    fewshot: int = 2
    """Worked examples shown as earlier chat turns (train questions of the same dataset)."""
    eval_buckets: int = 16
    """Question-hash buckets; bucket 0 is the eval split (about 1/eval_buckets of all questions)."""
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    """System message; it should ask for the answer between ``<answer>`` tags."""

    def __post_init__(self) -> None:
        if not (0 <= self.fewshot <= 8):
            raise ValueError("fewshot must be in 0..8")
        if self.eval_buckets < 2:
            raise ValueError("eval_buckets must be >= 2")


def _rg():
    try:
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
        from reasoning_gym.utils import extract_answer
    except ModuleNotFoundError:
        raise TaskNotInstalled("rg:<dataset> tasks need the reasoning-gym package (pip install reasoning-gym)") from None
    return reasoning_gym, DATASETS, extract_answer


def dataset_names() -> list[str]:
    """Every dataset reasoning-gym registers."""
    return sorted(_rg()[1])


def split_options(dataset: str, options: dict[str, Any]) -> tuple[RGKnobs, dict[str, Any]]:
    """(adapter knobs, reasoning-gym config kwargs) of ``options``; ``ValueError`` naming the
    dataset's known fields for an unknown key."""
    _, datasets, _ = _rg()
    if dataset not in datasets:
        raise ValueError(f"rg:{dataset}: reasoning-gym has no dataset {dataset!r} ({len(datasets)} known, e.g. "
                         f"{', '.join(sorted(datasets)[:6])}, ...)")
    config_cls = datasets[dataset][1]
    ours = {f.name for f in dataclasses.fields(RGKnobs)}
    theirs = {f.name for f in dataclasses.fields(config_cls)} - set(RESERVED)
    unknown = sorted(set(options) - ours - theirs)
    if unknown:
        raise ValueError(f"task.options: unknown knob(s) {unknown} for rg:{dataset}; its fields: {sorted(theirs)}; "
                         f"the adapter's: {sorted(ours)}")
    opts: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}
    try:
        knobs = RGKnobs(**{k: v for k, v in opts.items() if k in ours})
    except (TypeError, ValueError) as e:
        raise ValueError(f"task.options for rg:{dataset}: {e}") from None
    return knobs, {k: v for k, v in opts.items() if k in theirs}


class RGTask:
    """A reasoning-gym dataset behind the single-turn task interface (module docstring)."""

    def __init__(self, dataset: str, options: dict[str, Any] | None = None, seed: int = 0) -> None:
        rg, _, self._extract = _rg()
        self.name = f"rg:{dataset}"
        self.dataset_name = dataset
        self.seed = int(seed)
        self.knobs, self.rg_options = split_options(dataset, dict(options or {}))
        try:
            self._ds = rg.create_dataset(dataset, seed=0, size=1, **self.rg_options)
        except Exception as e:  # reasoning-gym validates its config with asserts and ValueErrors
            raise ValueError(f"task.options for rg:{dataset}: {type(e).__name__}: {e}") from None
        self.version = f"reasoning-gym-{getattr(rg, '__version__', '?')}"
        self._key = ("rg", dataset, tuple(sorted((k, repr(v)) for k, v in self.rg_options.items())))
        self._tag = "%08x" % (stable_hash("rg-config", self._key) & 0xFFFFFFFF)

    # -- problems -------------------------------------------------------------------------
    def split_of(self, question: str) -> Split:
        """The split a question text belongs to (a pure function of the text)."""
        return "eval" if stable_hash("rg-split", question) % self.knobs.eval_buckets == 0 else "train"

    @functools.lru_cache(maxsize=4096)
    def _item(self, idx: int) -> dict[str, Any]:
        return self._ds[idx]

    def _index(self, split: str, index: int) -> int:
        for attempt in range(MAX_ATTEMPTS):
            idx = stable_hash(self._key, self.seed, split, index, attempt) >> 1
            if self.split_of(self._item(idx)["question"]) == split:
                return idx
        raise RuntimeError(f"rg:{self.dataset_name}: no {split} question in {MAX_ATTEMPTS} draws")

    def problem(self, split: Split, index: int) -> Problem:
        """Problem ``index`` (>= 0) of ``split``; ``data`` is reasoning-gym's item index."""
        check_coordinates(split, index)
        idx = self._index(split, index)
        item = self._item(idx)
        return Problem(id=f"rg-{self.dataset_name}-{self._tag}-s{self.seed}-{split}-{index}",
                       question=str(item["question"]), answer=str(item["answer"]), data=idx)

    # -- prompts and rewards ----------------------------------------------------------------
    def _examples(self) -> list[tuple[str, str]]:
        out = []
        for k in range(self.knobs.fewshot):
            item = self._item(self._index("train", FEWSHOT_BASE + k))
            out.append((str(item["question"]), f"<answer>{item['answer']}</answer>"))
        return out

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        return chat_messages(self.knobs.system_prompt, self._examples(), problem.question)

    def render_prompt(self, tokenizer: Any, problem: Problem) -> list[int]:
        return render_prompt(tokenizer, self.messages(problem))

    def reward(self, problem: Problem, completion_text: str) -> float:
        """The dataset's ``score_answer`` on the last ``<answer>`` tag's text."""
        if not isinstance(problem.data, int):
            return 0.0
        try:
            answer = self._extract(completion_text) if isinstance(completion_text, str) else None
            return safe_score(self._ds.score_answer(answer, self._item(problem.data)), f"rg:{self.dataset_name} score_answer")
        except Exception as e:  # the library's scorer on a model's text: never let it stop the learner
            log.warning("rg:%s score_answer raised %r on %s: scored 0.0", self.dataset_name, e, problem.id)
            return 0.0
