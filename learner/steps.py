"""One learner step in each synchronisation mode (Echo): sequential pull and async push-pull.

Both read in order: wait for a batch (the time spent here is ``learner_idle_s``) -> rewards
recomputed with ``tasks/`` -> advantages -> GRPO update (in a worker thread, so the service
keeps serving leases and pushes meanwhile) -> publish version ``v + 1``.

- **Sequential:** add this step's prompt groups, lease them for version ``v``, wait for all of
  them, train. Generation and training alternate.
- **Async:** the prompt supply is topped up to ``sync.max_inflight_groups`` groups in flight;
  nodes generate continuously (each group under the version current when it was leased); a
  batch is the oldest admissible groups of the replay buffer (staleness <= ``S``). While the
  learner trains, nodes keep generating for the next batches.

Every row carries the step's time breakdown (``time_*`` fields, :mod:`learner.step_timing`).
"""

from __future__ import annotations

import time
from collections import Counter
from functools import partial
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import trio

from learner.behaviour_check import behaviour_diffs
from learner.checkpoint import LoopState
from learner.config import LearnerConfig
from learner.coordinator import COMPLETED, HELD, CompletedGroup, Coordinator, GroupSpec
from learner.episodes import initial_prompt
from learner.scoring import reward_fields, rewards_and_advantages
from learner.service import LearnerService
from learner.step_check import ChecksFailed, GroupCheck, StepChecks
from learner.step_timing import DissemWatch, StepClock, gen_seconds
from learner.trainer_api import TrainerAPI
from learner.verify_queue import VerifyQueue
from tasks.interface import SingleTurnTask, Tokenizer
from learner.verify import GroupToCheck
from learner.watch import sampled_completions
from swarm.proto.adapter import AdapterReply

#: Print a "waiting for rollouts" line when a batch has made no progress for this long.
WAIT_REPORT_S = 30.0


class TrainStep(Protocol):
    """One GRPO update (:meth:`learner.trainer_api.TrainerAPI.train_step`, maybe wrapped)."""

    def __call__(self, batch: Sequence[Any], checks: StepChecks | None = None) -> dict[str, float]: ...


@dataclass
class StepContext:
    """Everything a step function works with (built once by :func:`learner.loop.run_learner`)."""

    cfg: LearnerConfig
    state: LoopState
    coord: Coordinator
    service: LearnerService
    trainer: TrainerAPI
    task: SingleTurnTask
    tokenizer: Tokenizer
    console: Callable[[str], None]
    #: One GRPO update on a batch of samples: the trainer's ``train_step``, serialised with
    #: verification (:meth:`learner.verify.Verifier.exclusive`) when verification is on.
    train: TrainStep
    #: Times the last published version's dissemination (``learner.step_timing``); None = not timed.
    dissem_watch: DissemWatch | None = None


def add_problems(ctx: StepContext, n: int) -> list[str]:
    """Add ``n`` new prompt groups (the next problems of the train split); returns their ids."""
    specs = []
    for idx in range(ctx.state.next_problem, ctx.state.next_problem + n):
        problem = ctx.task.problem("train", idx)
        prompt = initial_prompt(ctx.task, ctx.tokenizer, problem, ctx.cfg.task.multi_turn)
        specs.append(GroupSpec(f"g{idx}", prompt, str(idx)))
    ctx.state.next_problem += n
    ctx.coord.add_groups(specs)
    ctx.service.notify()
    return [s.group_id for s in specs]


def top_up(ctx: StepContext) -> None:
    """Async mode: keep ``sync.max_inflight_groups`` groups pending, leased or buffered."""
    missing = ctx.cfg.sync.inflight_limit(ctx.cfg.train.prompts_per_step) - ctx.coord.in_flight()
    if missing > 0:
        add_problems(ctx, missing)


async def _wait_until(ctx: StepContext, ready: Callable[[], bool], describe: Callable[[], str],
                      refill: Callable[[], None] | None = None) -> None:
    """Wait for ``ready()``; meanwhile the last published version's dissemination is timed.
    ``refill()``, when given, runs at every change (e.g. to replace groups dropped meanwhile)."""
    watch = ctx.dissem_watch
    async with trio.open_nursery() as nursery:
        if watch is not None:
            nursery.start_soon(watch.run)
        await _wait_ready(ctx, ready, describe, refill)
        nursery.cancel_scope.cancel()


async def _wait_ready(ctx, ready, describe, refill=None) -> None:
    while True:
        if refill is not None:
            refill()
        if ready():
            return
        with trio.move_on_after(WAIT_REPORT_S) as scope:
            await ctx.service.wait_changed()
        if scope.cancelled_caught:
            ctx.console(f"learner: step {ctx.state.step + 1} waiting for rollouts ({describe()}, "
                        f"{len(ctx.service.roster)} node(s) joined)")


def first_minibatch(cfg: LearnerConfig, ids: list[str]) -> list[str]:
    """The groups of a step's first minibatch (``Trainer._minibatches``: every ``parts``-th from
    the first): its forward sees them on the version they were made with, so their checks run on it
    (``learner/step_check.py``)."""
    return ids[::max(1, min(cfg.train.minibatches, len(ids)))]


async def sequential_step(ctx: StepContext) -> dict[str, Any]:
    t0 = time.perf_counter()
    gen0 = gen_seconds(ctx.service.roster)
    ids = add_problems(ctx, ctx.cfg.train.prompts_per_step)
    coord, queue = ctx.coord, ctx.service.checks
    if queue is not None:
        queue.reserve(first_minibatch(ctx.cfg, ids))

    def ready() -> bool:  # trainable, or held for a check this step makes on its forward
        if queue is None:
            return all(coord.ledger[g] == COMPLETED for g in ids)
        return queue.step_ready(ids)

    idle, t_wait = 0.0, t0
    while True:
        await _wait_until(ctx, ready, lambda: f"{sum(coord.ledger[g] in (COMPLETED, HELD) for g in ids)}/{len(ids)} groups")
        if not ready():  # the verify worker took a push the step counted on while the wait ended
            continue
        idle += time.perf_counter() - t_wait
        deferred = queue.take_for_step() if queue is not None else []
        groups = coord.take(ids)
        try:
            return await _train_and_publish(ctx, groups, t0, idle, gen0, deferred)
        except ChecksFailed as failed:  # nothing was trained: wait for the failed pushes' replacements
            coord.untake(groups)
            _settle(queue, deferred, failed.failed)  # untrusts their peers: their groups go to others
            if queue is not None:
                queue.reserve(first_minibatch(ctx.cfg, ids))
            ctx.console(f"learner: step {ctx.state.step + 1}: {len(failed.failed)} group(s) failed verification "
                        "on the training forward; training again once other nodes replace them")
            t_wait = time.perf_counter()


async def async_step(ctx: StepContext) -> dict[str, Any]:
    t0 = time.perf_counter()
    gen0 = gen_seconds(ctx.service.roster)
    coord, n = ctx.coord, ctx.cfg.train.prompts_per_step
    top_up(ctx)
    # groups dropped as stale on arrival leave the supply during the wait: top it up again, or
    # a batch could wait for groups nobody is generating
    await _wait_until(ctx, lambda: coord.ready() >= n, lambda: f"{coord.ready()}/{n} groups ready",
                      refill=lambda: top_up(ctx))
    idle = time.perf_counter() - t0
    groups = coord.take_batch(n)
    top_up(ctx)  # nodes generate the next batches while this one trains
    return await _train_and_publish(ctx, groups, t0, idle, gen0)


def _export_reply(trainer, version: int):
    """The new adapter version as the service's reply, and the seconds its export took
    (blocking: run in a worker thread, so the service keeps answering nodes meanwhile)."""
    t = time.perf_counter()
    adapter = trainer.export_adapter(version)
    export_s = time.perf_counter() - t
    return AdapterReply.from_adapter(adapter), export_s


def _step_checks(queue, deferred: list) -> StepChecks | None:
    """The checks the training step makes on its own forward, one per group of each push it took
    from the verify queue (:mod:`learner.step_check`); ``None`` when there are none."""
    if not deferred:
        return None
    v = queue.verifier
    draw = bool(getattr(v.cfg, "draw", True))
    return StepChecks([GroupCheck(gid, len(result.completions),
                                  partial(v.judge_scored, GroupToCheck(item.peer_id, item.backend, item.cls, prompt, result)),
                                  v.uniforms(result) if draw else None)
                       for item in deferred for gid, prompt, result in item.picked])


def _settle(queue, deferred: list, failed: dict[str, str]) -> None:
    """The verdicts on the deferred pushes of a step: a push with a failed group (``failed``:
    group id -> reason) untrusts its peer; the others are credited."""
    for item in deferred:
        failure = next(((gid, failed[gid]) for gid, _p, _r in item.picked if gid in failed), None)
        queue.settle(item, failure)


async def _train(ctx: StepContext, samples: list, queue: VerifyQueue | None, deferred: list) -> dict:
    """The GRPO update (in a worker thread), verifying the deferred pushes' picked groups on its
    forward; raises :class:`~learner.step_check.ChecksFailed` when one fails (nothing trained)."""
    checks = _step_checks(queue, deferred)
    if checks is None or queue is None:
        return await trio.to_thread.run_sync(ctx.train, samples)
    try:
        stats = await trio.to_thread.run_sync(partial(ctx.train, samples, checks=checks))
    finally:
        queue.verifier.add_cost(checks.seconds, checks.judged)
    _settle(queue, deferred, {})
    return stats


async def _train_and_publish(ctx: StepContext, groups: list[CompletedGroup], t0: float, idle: float,
                             gen0: dict[str, float] | None = None, deferred: list | None = None) -> dict[str, Any]:
    state = ctx.state
    clock, watch = StepClock(t0, idle), ctx.dissem_watch  # watch: the version these rollouts waited for
    with clock.part("reward"):
        samples, rewards = rewards_and_advantages(groups, ctx.task, ctx.tokenizer,
                                                  scale_by_std=ctx.cfg.train.scale_rewards == "group")
    check: dict[str, float] = {}
    if ctx.cfg.train.behaviour_check:  # learner/behaviour_check.py
        with clock.part("check"):
            check = await trio.to_thread.run_sync(behaviour_diffs, ctx.trainer, groups, ctx.service.node_backends())
    t1 = time.perf_counter()
    stats = await _train(ctx, samples, ctx.service.checks, deferred or [])
    train_s = time.perf_counter() - t1
    clock.add_train(train_s, stats)
    trained_on = state.version
    state.step += 1
    state.version += 1
    t_exp = time.perf_counter()
    reply, export_s = await trio.to_thread.run_sync(_export_reply, ctx.trainer, state.version)
    clock.parts["export"] += export_s
    clock.parts["encode"] += time.perf_counter() - t_exp - export_s  # with the worker-thread hop
    with clock.part("publish"):
        ctx.service.publish(reply)
    ctx.dissem_watch = DissemWatch.start(ctx.service.dissem, state.version)
    step_time = time.perf_counter() - t0
    comps = [c for g in groups for c in g.result.completions]
    lags = Counter(trained_on - g.result.version for g in groups for _ in g.result.completions)
    report = ctx.cfg.report  # a table of sampled completions every N steps (learner/watch.py), popped by the loop
    shown = []
    if report.completions_every and state.step % report.completions_every == 0:
        shown = sampled_completions(state.step, groups, rewards, [s.advantage for s in samples], ctx.task,
                                    ctx.tokenizer, report.completions)
    return {
        **{f"train_{k}" if k in ("step", "step_time_s", "tokens", "sequences") else k: v
           for k, v in stats.items() if isinstance(v, (int, float))},
        "step": state.step,
        "policy_version": state.version,
        "trained_on_version": trained_on,
        **reward_fields(rewards),
        "samples": len(rewards),
        "step_time_s": round(step_time, 3),
        "learner_idle_s": round(idle, 3),
        "gen_wait_s": round(idle, 3),
        "train_s": round(train_s, 3),
        "samples_per_s": round(len(rewards) / max(step_time, 1e-9), 3),
        "nodes": ctx.service.take_contributions(),
        "trained_groups": dict(Counter(g.peer_id for g in groups)),  # the work ledger's (learner/ledger.py) ...
        "trained_ids": {p: [g.spec.group_id for g in groups if g.peer_id == p] for p in {g.peer_id for g in groups}},
        "completions": shown,
        "rollout_versions": sorted({g.result.version for g in groups}),
        "staleness_hist": {str(k): v for k, v in sorted(lags.items())},
        "staleness_max": max(lags, default=0),
        "dropped": ctx.coord.take_drop_counts(),
        "buffer_groups": len(ctx.coord.completed),
        "mean_completion_tokens": sum(len(c.token_ids) for c in comps) / len(comps),
        "stop_frac": sum(c.finish_reason == "stop" for c in comps) / len(comps),
        **check,
        **clock.fields(step_time, gen_seconds(ctx.service.roster), gen0 or {}, watch),
    }
