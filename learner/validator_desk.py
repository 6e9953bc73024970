"""Validators at work: a picked group of a node whose numerics the learner cannot reproduce
(torch, MLX: CUDA, Metal, CPU) is replayed by another node of the same class, and refereed by a
third when the two disagree. The decisions are the pure functions of ``learner/validators.py``;
this is the I/O around them.

- **Choose.** The verify queue asks :meth:`ValidatorDesk.choose` for each picked group that the
  learner does not replay itself: a single-turn group whose producer declares a validated class
  (:func:`learner.validators.device_class`) that another live node shares.
- **Ask.** :meth:`ValidatorDesk.check` picks a random validator of the class
  (:func:`~learner.validators.pick_validator`) and queues a blind job for it
  (:func:`~learner.validators.blind_request` as a :class:`swarm.proto.validate.ValidateJob`: no
  group id, no producer). The learner never dials a node: the job goes out in the reply to the
  validator's next work request (:meth:`job_for`, asked first by the work long poll, which is
  woken), and the node answers on ``VALIDATE`` (:meth:`deliver`). Only the peer a job went to can
  answer it, once.
- **Compare.** Tokens exactly, log-probs within ``validators.max_logprob_diff``
  (:func:`learner.replay.compare_group`).
- **Referee.** A disagreement asks a second validator (:func:`~learner.validators.referee`): the
  producer that disagrees with two others fails the group (the verify queue untrusts it); a first
  validator that disagrees with two others is untrusted here; three different answers untrust
  nobody and are counted (``validator_inconclusive``).
- **Fall back.** No validator (or no second one), a validator that does not answer within
  ``validators.deadline_s`` or reports an error, or an inconclusive referee: the group gets the
  statistical check instead (``validator_fallback``).
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import trio

from learner.config_verify import ValidatorConfig
from learner.replay import ReplayBudget, compare_group
from learner.validators import blind_request, pick_validator, referee
from learner.work_desk import SamplingDefaults
from swarm.proto.validate import ValidateJob, ValidateResult
from swarm.proto.work import group_seed

log = logging.getLogger("echo_swarm.learner")

#: The verify queue's answer for a group the validators could not decide (check it statistically).
FALLBACK = "fallback"


@dataclass
class _Job:
    peer_id: str
    job: ValidateJob
    done: trio.Event = field(default_factory=trio.Event)
    handed: bool = False
    result: ValidateResult | None = None


class ValidatorDesk:
    """Validation jobs in flight, by validator. ``classes()``: peer -> declared class (None: not
    a validated node) of the live nodes; ``untrust(peer, reason)``: the service's path for a
    validator that lost a referee; ``wake()``: wakes the work long polls (a job is queued)."""

    def __init__(self, cfg: ValidatorConfig, sampling: SamplingDefaults, *, classes: Callable[[], dict[str, str | None]],
                 untrust: Callable[[str, str], None], wake: Callable[[], None], rng: random.Random | None = None) -> None:
        self.cfg = cfg
        self.sampling = sampling
        self.classes = classes
        self.untrust = untrust
        self.wake = wake
        self.rng = rng if rng is not None else random.SystemRandom()
        self._queued: dict[str, deque[_Job]] = {}
        self._jobs: dict[str, _Job] = {}
        #: This step's figures (:meth:`take_metrics`), and the run's totals.
        self.counts = dict.fromkeys(("groups", "failed", "fallback", "disagreements", "inconclusive", "untrusted"), 0)
        self.spent_s = 0.0
        self.total = dict(self.counts)
        #: Seconds of validator waits per step (``budget_s_per_step``; the replay's accounting).
        self.budget = ReplayBudget(cfg.budget_s_per_step, cfg.first_groups)

    # -- the verify queue's side ----------------------------------------------------------------
    def choose(self, peer_id: str, result: Any) -> bool:
        """Whether a picked group of ``peer_id`` goes to a validator: single turn, and another live
        node shares the producer's class, and the per-step budget allows it (a node's first groups
        always)."""
        if not self.cfg.enabled or any(c.mask for c in result.completions):
            return False
        if pick_validator(self.classes(), peer_id, set(), random.Random(0)) is None:
            return False
        return self.budget.allow(peer_id)

    async def check_all(self, items: list[tuple[str, str, list[int], Any]]) -> dict[str, str | None]:
        """:meth:`check` of each (producer, group id, prompt ids, pushed ``GroupResult``), together;
        group id -> failure reason or None, or :data:`FALLBACK`."""
        out: dict[str, str | None] = {}

        async def one(item) -> None:
            out[item[1]] = await self.check(*item)

        async with trio.open_nursery() as nursery:
            for item in items:
                nursery.start_soon(one, item)
        return out

    async def check(self, producer: str, group_id: str, prompt_ids: list[int], result: Any) -> str | None:
        """One group through its validators: None (confirmed), a failure reason (the producer
        disagrees with two validators), or :data:`FALLBACK`."""
        t0 = time.perf_counter()
        try:
            verdict = await self._check(producer, group_id, prompt_ids, result)
        finally:
            waited = time.perf_counter() - t0
            self.spent_s += waited
            self.budget.measured(waited)
        key = "fallback" if verdict == FALLBACK else "groups"
        self._count(key)
        if verdict not in (None, FALLBACK):
            self._count("failed")
        return verdict

    async def _check(self, producer: str, group_id: str, prompt_ids: list[int], result: Any) -> str | None:
        pushed = [(c.token_ids, c.logprobs) for c in result.completions]
        s, tol = self.sampling, self.cfg.max_logprob_diff

        def job() -> ValidateJob:
            return blind_request(prompt_ids, len(pushed), result.version, s.temperature, s.top_p, s.max_tokens,
                                 group_seed(s.seed, group_id))

        first = pick_validator(self.classes(), producer, set(), self.rng)
        got1 = None if first is None else await self._ask(first, job())
        if first is None or got1 is None:
            return FALLBACK
        why1 = compare_group(pushed, got1, tol)
        if referee(producer, first, why1 is None).outcome == "pass":
            return None
        self._count("disagreements")
        log.warning("validator %s disagrees with group %s of %s (%s); asking a second validator",
                    first[-6:], group_id, producer[-6:], why1)
        second = pick_validator(self.classes(), producer, {first}, self.rng)
        got2 = None if second is None else await self._ask(second, job())
        if second is None or got2 is None:
            return FALLBACK
        v = referee(producer, first, False, second, compare_group(pushed, got2, tol) is None,
                    compare_group(got1, got2, tol) is None)
        if v.outcome == "validator":
            self._count("untrusted")
            self.untrust(first, f"validator disagreed with two others on a replay ({why1})")
            return None
        if v.outcome == "producer":
            return f"validator: {why1} (a second validator agrees with the first)"
        if v.outcome == "inconclusive":
            self._count("inconclusive")
            log.warning("group %s of %s: producer and two validators all differ; statistical check instead",
                        group_id, producer[-6:])
            return FALLBACK
        return None

    async def _ask(self, peer_id: str, job: ValidateJob) -> list[tuple[list[int], list[float]]] | None:
        """Queue ``job`` for ``peer_id`` and wait (``deadline_s``) for its answer: per completion
        (token ids, log-probs), or None (no room, timeout, an error or a malformed answer)."""
        queue = self._queued.setdefault(peer_id, deque())
        if len(queue) >= self.cfg.max_jobs_per_peer:
            return None
        entry = _Job(peer_id, job)
        queue.append(entry)
        self._jobs[job.request_id] = entry
        self.wake()
        try:
            with trio.move_on_after(self.cfg.deadline_s):
                await entry.done.wait()
        finally:
            self._jobs.pop(job.request_id, None)
            if entry in queue:
                queue.remove(entry)
            if not queue:
                self._queued.pop(peer_id, None)
        got = entry.result
        if got is None:
            log.warning("validator %s did not answer within %.0fs", peer_id[-6:], self.cfg.deadline_s)
            return None
        if got.error:
            log.warning("validator %s could not replay: %s", peer_id[-6:], got.error[:200])
            return None
        return [(c.token_ids, c.logprobs) for c in got.completions]

    # -- the service's side ---------------------------------------------------------------------
    def job_for(self, peer_id: str) -> ValidateJob | None:
        """The next job waiting for ``peer_id`` (handed out once), or None."""
        queue = self._queued.get(peer_id)
        while queue:
            entry = queue.popleft()
            if entry.job.request_id in self._jobs and not entry.handed:
                entry.handed = True
                return entry.job
        return None

    def deliver(self, peer_id: str, msg: ValidateResult) -> bool:
        """A validator's answer: accepted only from the peer the job was handed to, once."""
        entry = self._jobs.get(msg.request_id)
        if entry is None or entry.peer_id != peer_id or not entry.handed or entry.result is not None:
            log.warning("ignored a validation result from %s (not the answer to a job it holds)", peer_id[-6:])
            return False
        entry.result = msg
        entry.done.set()
        return True

    # -- figures --------------------------------------------------------------------------------
    def _count(self, key: str) -> None:
        self.counts[key] += 1
        self.total[key] += 1

    def take_metrics(self) -> dict[str, float]:
        """This step's figures: ``validator_groups`` (decided by validators), ``validator_failed``,
        ``validator_fallback``, ``validator_disagreements``, ``validator_inconclusive``,
        ``validator_untrusted``, ``validator_s`` (seconds waited, summed over groups) and
        ``validator_budget_s`` (the budget's credit left for the next step); starts the next
        step's budget."""
        out: dict[str, float] = {f"validator_{k}": v for k, v in self.counts.items()}
        out["validator_s"] = round(self.spent_s, 3)
        self.budget.new_step()
        out["validator_budget_s"] = round(self.budget.credit, 3) if self.budget.credit is not None else 0.0
        self.counts = dict.fromkeys(self.counts, 0)
        self.spent_s = 0.0
        return out
