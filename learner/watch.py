"""What a user watches of a run besides the step rows: sampled completions and the held-out curve.

- **Sampled completions** (``report.completions_every``, TRL's ``log_completions``): every N steps
  :func:`sampled_completions` takes ``report.completions`` of the step's completions, in turn
  from its prompt groups, with the question, the decoded answer, the reference answer, the
  reward the learner recomputed, the GRPO advantage, the node that generated it and the adapter
  version it was generated with. The held-out evaluation's answers join them (``split`` ``eval``,
  verl's ``log_val_generations``).
- **The held-out curve** (``[eval]``, :mod:`learner.heldout`): one :class:`~learner.heldout.EvalPoint`
  per evaluation.

:class:`RunWatch` is their one owner: it appends them to ``completions.jsonl`` and ``eval.jsonl``
in the run directory (one JSON object a line; on resume lines after the checkpoint's step are cut,
as ``metrics.jsonl`` is), sends the tables and the step-0 score to TensorBoard / W&B through the
metrics writer, and publishes a typed snapshot (:meth:`RunWatch.statistics`) for the dashboard.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from learner.eval import EvalSample
from learner.heldout import EvalPoint
from learner.metrics import MetricsWriter

COMPLETIONS_FILE = "completions.jsonl"
EVAL_FILE = "eval.jsonl"
#: Columns of a completions table, in order (the fields of :class:`CompletionRecord`).
COLUMNS = ("step", "split", "version", "group", "peer", "question", "completion", "answer", "reward", "advantage",
           "tokens", "finish")
#: Characters of a question or completion kept in a record (a long answer is cut, marked with "...").
MAX_TEXT = 2000


@dataclass(frozen=True)
class CompletionRecord:
    """One sampled completion of a training step (``split`` ``train``) or of a held-out
    evaluation (``eval``). ``reward`` None: its reward function failed (NaN)."""

    step: int
    split: str
    #: The adapter version that generated it.
    version: int
    #: The prompt group (``g<problem>``) or the eval problem (``eval-<i>``).
    group: str
    #: The node that generated it (``learner`` for the held-out evaluation).
    peer: str
    question: str
    completion: str
    answer: str
    reward: float | None
    #: The GRPO advantage it was trained with (None for an evaluation answer).
    advantage: float | None
    tokens: int
    finish: str

    def row(self) -> list[Any]:
        return [getattr(self, c) for c in COLUMNS]


@dataclass(frozen=True)
class WatchStats:
    """The dashboard's view of :class:`RunWatch`: the curve and the newest tables."""

    evals: tuple[EvalPoint, ...]
    #: The newest training step's sampled completions, and the newest evaluation's answers.
    completions: tuple[CompletionRecord, ...]
    eval_samples: tuple[CompletionRecord, ...]


def _text(s: str) -> str:
    return s if len(s) <= MAX_TEXT else s[:MAX_TEXT] + "..."


def _finite(x: float) -> float | None:
    return round(float(x), 4) if math.isfinite(x) else None


def sampled_completions(step: int, groups: Sequence[Any], rewards: Sequence[float], advantages: Sequence[float],
                        task: Any, tokenizer: Any, k: int) -> list[CompletionRecord]:
    """``k`` completions of a step's ``groups`` (``CompletedGroup``s; ``rewards`` and ``advantages``
    flat, in the groups' order), the first of every group, then the second, ...; pure but for
    decoding their tokens."""
    offsets, at = [], 0
    for g in groups:
        offsets.append(at)
        at += len(g.result.completions)
    picks: list[tuple[int, int]] = []
    depth = max((len(g.result.completions) for g in groups), default=0)
    for j in range(depth):
        picks += [(i, j) for i, g in enumerate(groups) if j < len(g.result.completions)]
    out = []
    for i, j in picks[:max(0, k)]:
        g = groups[i]
        c = g.result.completions[j]
        problem = task.problem("train", int(g.spec.problem_ref))
        text = tokenizer.decode(list(c.token_ids), skip_special_tokens=True)
        out.append(CompletionRecord(step, "train", int(g.result.version), g.spec.group_id, g.peer_id,
                                    _text(str(problem.question)), _text(text), _text(str(problem.answer)),
                                    _finite(rewards[offsets[i] + j]), _finite(advantages[offsets[i] + j]),
                                    len(c.token_ids), str(c.finish_reason)))
    return out


def eval_records(point: EvalPoint, samples: Sequence[EvalSample], k: int) -> list[CompletionRecord]:
    """The first ``k`` answers of an evaluation as completion records (``split`` ``eval``)."""
    return [CompletionRecord(point.step, "eval", point.version, f"eval-{s.index}", "learner", _text(s.question),
                             _text(s.completion), _text(s.answer), _finite(s.reward), None, s.tokens, s.finish)
            for s in samples[:max(0, k)]]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file; a torn last line (a crash mid-write) is skipped."""
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    out = []
    for i, line in enumerate(lines):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i != len(lines) - 1:
                raise
    return out


def _cut(path: Path, resume_step: int | None) -> list[dict[str, Any]]:
    """A fresh file (``resume_step`` None), or the lines up to ``resume_step`` kept."""
    if resume_step is None:
        path.write_text("")
        return []
    kept = [r for r in read_jsonl(path) if int(r.get("step", 0)) <= resume_step]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    tmp.replace(path)
    return kept


def _record(d: dict[str, Any]) -> CompletionRecord:
    values: dict[str, Any] = {f.name: d.get(f.name) for f in dataclasses.fields(CompletionRecord)}
    return CompletionRecord(**values)


Table = tuple[CompletionRecord, ...]


def latest_tables(records: Sequence[CompletionRecord]) -> tuple[Table, Table]:
    """The newest step's training records and the newest evaluation's records (pure)."""
    out = []
    for split in ("train", "eval"):
        mine = [r for r in records if r.split == split]
        last = max((r.step for r in mine), default=None)
        out.append(tuple(r for r in mine if r.step == last))
    return out[0], out[1]


def read_watch(run_dir: Path) -> WatchStats:
    """What :meth:`RunWatch.statistics` showed at the end of a run, from its files."""
    evals = tuple(EvalPoint(**d) for d in read_jsonl(Path(run_dir) / EVAL_FILE))
    return WatchStats(evals, *latest_tables([_record(d) for d in read_jsonl(Path(run_dir) / COMPLETIONS_FILE)]))


class RunWatch:
    """The one writer of ``completions.jsonl`` and ``eval.jsonl`` (module docstring).
    ``resume_step``: None for a new run, else the checkpoint's step (later lines are cut)."""

    def __init__(self, run_dir: Path, metrics: MetricsWriter, *, resume_step: int | None = None,
                 eval_samples: int = 4) -> None:
        self.metrics = metrics
        self.eval_samples = eval_samples
        self.completions_path = Path(run_dir) / COMPLETIONS_FILE
        self.eval_path = Path(run_dir) / EVAL_FILE
        self._evals = [EvalPoint(**d) for d in _cut(self.eval_path, resume_step)]
        self._latest, self._latest_eval = latest_tables([_record(d) for d in _cut(self.completions_path, resume_step)])

    def completions(self, step: int, records: Sequence[CompletionRecord]) -> None:
        """A training step's sampled completions: the file, the sinks' table, the dashboard."""
        if not records:
            return
        self._append(self.completions_path, [dataclasses.asdict(r) for r in records])
        self.metrics.write_table(step, "completions", list(COLUMNS), [r.row() for r in records])
        self._latest = tuple(records)

    def evaluated(self, point: EvalPoint, samples: Sequence[EvalSample]) -> dict[str, float | int]:
        """A held-out evaluation: its point in ``eval.jsonl`` (and, at step 0, which has no row,
        in the sinks), its first answers beside the completions; returns the row's ``eval_*`` fields."""
        self._append(self.eval_path, [dataclasses.asdict(point)])
        self._evals.append(point)
        if point.step == 0:
            self.metrics.write_scalars(0, {k: float(v) for k, v in point.fields().items()})
        records = eval_records(point, samples, self.eval_samples)
        if records:
            self._append(self.completions_path, [dataclasses.asdict(r) for r in records])
            self.metrics.write_table(point.step, "eval_completions", list(COLUMNS), [r.row() for r in records])
            self._latest_eval = tuple(records)
        return point.fields()

    def statistics(self) -> WatchStats:
        return WatchStats(tuple(self._evals), self._latest, self._latest_eval)

    @staticmethod
    def _append(path: Path, objs: list[dict[str, Any]]) -> None:
        with path.open("a") as f:
            f.write("".join(json.dumps(o, allow_nan=False) + "\n" for o in objs))
