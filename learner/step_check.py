"""Verification on the training step's own forward (``verify.in_step``): one forward, not two.

In sequential mode every group of a step was generated with the weights the step starts from, so
the log-probs, entropies and surprisal variances that :mod:`learner.verify` needs are exactly what
the first optimizer update's forward computes for that group. A step given :class:`StepChecks`
trains in this order (:meth:`learner.trainer.Trainer.train_step`):

1. the checked groups go into the first minibatch, each in a micro-batch of its own, before any
   other group; their forward (with gradients) yields the logits of the whole group;
2. from those logits (detached) each completion's per-token log-prob, entropy and surprisal
   variance are computed (:func:`scored_rows`, the same figures as
   :meth:`learner.trainer.Trainer.token_stats`) and the group is judged (:meth:`StepChecks.judge`);
3. when every checked group has been judged (they come first, before any optimizer update and
   before any other group's backward), a failure abandons the step: its gradients are dropped
   and :class:`ChecksFailed` says which groups failed. The step function then untrusts their
   peers, whose groups go to other nodes, waits for the replacements and trains the whole batch
   again (:func:`learner.steps.sequential_step`). Nothing of a failed push is ever trained and no
   step trains on fewer groups, as when the check ran before the step.

A checked group that the trainer's micro-batching splits (a group larger than a micro-batch, or
one that shares a micro-batch) is scored by :meth:`~learner.trainer.Trainer.token_stats` before the
update instead: two forwards for that group only, same verdict.

The cost of a check is the extra softmax statistics over the group's logits (and the draw check's
distances, :mod:`learner.draw_check`) plus the judgement (:attr:`StepChecks.seconds`), not a model
forward.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from learner.forward import token_rows
from learner.verify import Scored


class ChecksFailed(Exception):
    """A training step abandoned before any update because checks on its forward failed."""

    def __init__(self, failed: dict[str, str]) -> None:
        super().__init__(f"{len(failed)} checked group(s) failed: " + "; ".join(f"{g}: {r}" for g, r in failed.items()))
        #: group id -> failure reason
        self.failed = dict(failed)


@dataclass(frozen=True)
class GroupCheck:
    """One picked group to verify inside the step."""

    group_id: str
    #: Completions of the group (its rows in the batch).
    size: int
    #: The verdict on the group's scored completions: the failure reason, or ``None``.
    judge: Callable[[list[Scored]], str | None]
    #: The uniform each of its tokens was drawn with (:func:`learner.draw_check.completion_uniforms`),
    #: per completion: the draw check runs on the same logits; None: no draw check.
    uniforms: list[np.ndarray] | None = None


@dataclass
class StepChecks:
    """The checks of one training step and their outcome."""

    checks: list[GroupCheck]
    #: group id -> failure reason, for every checked group that failed.
    failed: dict[str, str] = field(default_factory=dict)
    #: Checks judged (passed or failed), and how many of them ran on the training forward.
    judged: int = 0
    fused: int = 0
    #: Seconds spent on the checks' own work (statistics and judgement; plus the separate forward
    #: of a group that could not be fused).
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self._by_id = {c.group_id: c for c in self.checks}
        self._done: set[str] = set()

    @property
    def group_ids(self) -> set[str]:
        return set(self._by_id)

    def pending(self) -> list[GroupCheck]:
        """Checks not judged yet (in order)."""
        return [c for c in self.checks if c.group_id not in self._done]

    def whole(self, mb: Sequence[Any]) -> GroupCheck | None:
        """The check whose group is exactly micro-batch ``mb`` (all its rows and nothing else)."""
        gids = {getattr(s, "group_id", "") for s in mb}
        if len(gids) != 1:
            return None
        check = self._by_id.get(next(iter(gids)))
        if check is None or check.group_id in self._done or len(mb) != check.size:
            return None
        return check

    def judge(self, check: GroupCheck, scored: list[Scored], *, fused: bool, started: float) -> bool:
        """Record the verdict on ``check``'s group; returns whether it passed. ``started``: the
        ``time.perf_counter()`` when the check's own work began."""
        reason = check.judge(scored)
        self._done.add(check.group_id)
        self.judged += 1
        self.fused += int(fused)
        if reason is not None:
            self.failed[check.group_id] = reason
        self.seconds += time.perf_counter() - started
        return reason is None


def scored_rows(logp_all: Any, targets: Any, lengths: Sequence[int], uniforms: Sequence[np.ndarray] | None = None,
                top_p: float = 1.0) -> list[Scored]:
    """Per completion (row) of one group, from ``logp_all`` [n, T, V] (the training forward's
    temperature-scaled log-softmax, detached) and ``targets`` [n, T]: what
    :meth:`learner.trainer.Trainer.token_stats` returns (:func:`learner.forward.token_rows`), with
    the draw distances when ``uniforms`` are given."""
    return as_scored(token_rows(logp_all, targets, lengths, uniforms=uniforms, top_p=top_p))


def check_unfused(first: Sequence[Any], checks: StepChecks, micro_batches: Callable[[Sequence[Any]], list[list[int]]],
                  token_stats: Callable[..., list[tuple]], temperature: float, top_p: float) -> None:
    """Checks whose group is not a micro-batch of the first minibatch ``first`` on its own (as the
    trainer's ``micro_batches`` splits it): scored by ``token_stats`` (the trainer's pass, their own
    forward) and judged before any update."""
    fused = {c.group_id for mb in micro_batches(first) if (c := checks.whole([first[i] for i in mb])) is not None}
    for c in checks.pending():
        rows = [s for s in first if getattr(s, "group_id", "") == c.group_id]
        if c.group_id in fused or not rows:  # fused: judged on its training forward; absent: nothing to score
            continue
        t = time.perf_counter()
        stats = token_stats(rows[0].prompt_ids, [s.completion_ids for s in rows], temperature, uniforms=c.uniforms,
                            top_p=top_p)
        checks.judge(c, as_scored(stats), fused=False, started=t)


def first_minibatch_order(groups: list[list[Any]], first: set[str], parts: int) -> list[list[list[Any]]]:
    """Split the batch's groups (lists of samples, batch order) into at most ``parts`` minibatches
    of whole groups, as many groups in each as without checks. When the groups in ``first`` (by
    the ``group_id`` of their samples) are among those the first minibatch holds without checks
    (every ``parts``-th group from the first: the verify queue leaves exactly those to the step,
    ``learner/verify_queue.py``), the split is the one without checks, so checks change nothing of
    what each update trains; otherwise they all go into the first minibatch, ahead of any other
    (it grows if they are more than its share)."""
    parts = max(1, min(parts, len(groups)))
    is_first = [bool(g) and getattr(g[0], "group_id", "") in first for g in groups]
    if not any(is_first[k] for k in range(len(groups)) if k % parts):
        return [groups[k::parts] for k in range(parts)]
    order = [g for g, f in zip(groups, is_first) if f] + [g for g, f in zip(groups, is_first) if not f]
    sizes = [len(range(k, len(groups), parts)) for k in range(parts)]
    sizes[0] = max(sizes[0], sum(is_first))
    out, at = [], 0
    for size in sizes:
        if at < len(order):
            out.append(order[at:at + size])
            at += size
    if at < len(order):  # the first minibatch grew: the last one takes what is left
        out[-1] += order[at:]
    return out


def as_scored(stats: list[tuple]) -> list[Scored]:
    """``Trainer.token_stats`` rows (log-prob, entropy, variance[, draw distances]) as :class:`Scored`."""
    return [Scored(*row) for row in stats]
