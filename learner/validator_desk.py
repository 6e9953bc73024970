"""Validators at work: a picked group of a node whose numerics the learner cannot reproduce exactly
(torch, MLX: CUDA, Metal, CPU) is replayed by another node of the same declared class, as a tip
for the learner. The decisions are the pure functions of ``learner/validators.py``; this is the I/O
around them.

- **Choose.** The verify queue asks :meth:`ValidatorDesk.choose` for each picked group: a
  single-turn group whose producer declares a validated class (:func:`learner.validators.device_class`)
  that another live node shares, not a validator that lost its role.
- **Ask.** :meth:`ValidatorDesk.check` picks a random validator of the class
  (:func:`~learner.validators.pick_validator`) and queues a blind job for it
  (:func:`~learner.validators.blind_request` as a :class:`swarm.proto.validate.ValidateJob`: no
  group id, no producer). The learner never dials a node: the job goes out in the reply to the
  validator's next work request (:meth:`job_for`, asked first by the work long poll, which is
  woken), and the node answers on ``VALIDATE`` (:meth:`deliver`). Only the peer a job went to can
  answer it, once.
- **Compare.** Tokens exactly, log-probs within ``validators.max_logprob_diff``
  (:func:`learner.replay.compare_group`).
- **Never decide.** The answer is a tip: the verify queue asks it after the push's own checks
  released the group, so a validator never holds a step. A replay that differs is settled by the
  learner's own checks (:meth:`settle_dispute`, :func:`learner.validators.dispute`): a validator
  whose replay fails the learner's draw check is untrusted; a producer whose group fails the
  learner's strict check is untrusted by that check; when both pass, the validator disagreed with
  the learner's own check and loses its role (no more jobs), nobody untrusted.
- **Fall back.** No validator, no answer within ``validators.deadline_s``, an error: nothing more
  is learned about the group (``validator_fallback``); its own checks already decided it.
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
from learner.validators import blind_request, dispute, pick_validator
from learner.work_desk import SamplingDefaults
from swarm.proto.rollouts import GroupResult
from swarm.proto.validate import ValidateJob, ValidateResult
from swarm.proto.work import group_seed

log = logging.getLogger("echo_swarm.learner")

#: The answer for a group no validator replayed (none of its class, no answer in time, an error).
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
    validator whose replay failed the learner's checks; ``wake()``: wakes the work long polls (a job
    is queued)."""

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
        #: Validators that disagreed with the learner's own check: no more jobs for them.
        self.demoted: set[str] = set()
        #: This step's figures (:meth:`take_metrics`), and the run's totals.
        self.counts = dict.fromkeys(("groups", "agreed", "fallback", "disagreements", "caught", "untrusted",
                                     "demoted"), 0)
        self.spent_s = 0.0
        self.total = dict(self.counts)
        #: Seconds of validator waits per step (``budget_s_per_step``; the replay's accounting).
        self.budget = ReplayBudget(cfg.budget_s_per_step, cfg.burst_steps)

    # -- the verify queue's side ----------------------------------------------------------------
    def choose(self, peer_id: str, result: Any) -> bool:
        """Whether a picked group of ``peer_id`` goes to a validator: single turn, and another live
        node of the producer's class still holds the role, and the per-step budget allows it."""
        if not self.cfg.enabled or any(c.mask for c in result.completions):
            return False
        if pick_validator(self.classes(), peer_id, set(self.demoted), random.Random(0)) is None:
            return False
        return self.budget.allow(peer_id)

    async def check_all(self, items: list[tuple[str, str, list[int], Any]]) -> dict[str, Any]:
        """:meth:`check` of each (producer, group id, prompt ids, pushed ``GroupResult``), together;
        group id -> its answer."""
        out: dict[str, Any] = {}

        async def one(item) -> None:
            out[item[1]] = await self.check(*item)

        async with trio.open_nursery() as nursery:
            for item in items:
                nursery.start_soon(one, item)
        return out

    async def check(self, producer: str, group_id: str, prompt_ids: list[int], result: Any) -> Any:
        """One group's replay by a validator: ``(validator, None)`` when it is the pushed group,
        ``(validator, its replay as a GroupResult)`` when it differs (for the learner's own checks:
        :meth:`settle_dispute`), or :data:`FALLBACK`."""
        t0 = time.perf_counter()
        try:
            answer = await self._check(producer, group_id, prompt_ids, result)
        finally:
            waited = time.perf_counter() - t0
            self.spent_s += waited
            self.budget.measured(waited)
        self._count("fallback" if answer == FALLBACK else "groups")
        return answer

    async def _check(self, producer: str, group_id: str, prompt_ids: list[int], result: Any) -> Any:
        pushed = [(c.token_ids, c.logprobs) for c in result.completions]
        s = self.sampling
        job = blind_request(prompt_ids, len(pushed), result.version, s.temperature, s.top_p, s.max_tokens,
                            group_seed(s.seed, group_id))
        validator = pick_validator(self.classes(), producer, set(self.demoted), self.rng)
        if validator is None:
            return FALLBACK
        got = await self._ask(validator, job)
        if got is None:
            return FALLBACK
        why = compare_group(pushed, [(c.token_ids, c.logprobs) for c in got], self.cfg.max_logprob_diff)
        if why is None:
            self._count("agreed")
            return validator, None
        self._count("disagreements")
        log.warning("validator %s's replay differs from group %s of %s (%s); the learner's own checks decide",
                    validator[-6:], group_id, producer[-6:], why)
        return validator, GroupResult(group_id=group_id, version=result.version, completions=list(got))

    def settle_dispute(self, validator: str, producer: str, group_id: str, why_validator: str | None,
                       why_producer: str | None) -> str:
        """The learner's own checks of a disagreement (:func:`learner.validators.dispute`): untrust
        the validator whose replay fails them, count a producer they caught (the verify queue
        untrusts it), or take the role from a validator that disagreed with them."""
        outcome = dispute(why_validator is not None, why_producer is not None)
        if outcome == "validator":
            self._count("untrusted")
            self.untrust(validator, f"its replay of a validation job was not drawn from the job's seed ({why_validator})")
        elif outcome == "producer":
            self._count("caught")
        else:
            self._count("demoted")
            self.demoted.add(validator)
            log.warning("validator %s disagreed with the learner's own check of group %s of %s: no more jobs for it",
                        validator[-6:], group_id, producer[-6:])
        return outcome

    async def _ask(self, peer_id: str, job: ValidateJob) -> list | None:
        """Queue ``job`` for ``peer_id`` and wait (``deadline_s``) for its answer: its completions,
        or None (no room, timeout, an error or a malformed answer)."""
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
        return list(got.completions)

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
        """This step's figures: ``validator_groups`` (replayed by a validator), ``validator_agreed``,
        ``validator_fallback`` (none replayed it), ``validator_disagreements``, what the learner's
        own checks made of them (``validator_caught``: the producer failed, ``validator_untrusted``:
        the validator's replay failed, ``validator_demoted``: neither), ``validator_s`` (seconds
        waited, summed over groups) and ``validator_budget_s`` (the budget's credit left for the
        next step); starts the next step's budget."""
        out: dict[str, float] = {f"validator_{k}": v for k, v in self.counts.items()}
        out["validator_s"] = round(self.spent_s, 3)
        self.budget.new_step()
        out["validator_budget_s"] = round(self.budget.credit, 3) if self.budget.credit is not None else 0.0
        self.counts = dict.fromkeys(self.counts, 0)
        self.spent_s = 0.0
        return out
