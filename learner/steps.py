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
from typing import Any, Callable

import trio

from learner.behaviour_check import behaviour_diffs
from learner.checkpoint import LoopState
from learner.config import LearnerConfig
from learner.coordinator import COMPLETED, HELD, CompletedGroup, Coordinator, GroupSpec
from learner.episodes import initial_prompt
from learner.scoring import reward_fields, score_groups
from learner.service import LearnerService
from learner.step_check import ChecksFailed, GroupCheck, StepChecks
from learner.step_timing import DissemWatch, StepClock, gen_seconds
from learner.watch import sampled_completions
from swarm.proto.adapter import AdapterReply

#: Print a "waiting for rollouts" line when a batch has made no progress for this long.
WAIT_REPORT_S = 30.0


@dataclass
class StepContext:
    """Everything a step function works with (built once by :func:`learner.loop.run_learner`)."""

    cfg: LearnerConfig
    state: LoopState
    coord: Coordinator
    service: LearnerService
    trainer: Any
    task: Any
    tokenizer: Any
    console: Callable[[str], None]
    #: One GRPO update on a batch of samples: the trainer's ``train_step``, serialised with
    #: verification (:meth:`learner.verify.Verifier.exclusive`) when verification is on.
    train: Callable[[list], dict]
    #: Times the last published version's dissemination (``learner.step_timing``); None = not timed.
    dissem_watch: DissemWatch | None = None


def add_problems(ctx, n: int) -> list[str]:
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


def top_up(ctx) -> None:
    """Async mode: keep ``sync.max_inflight_groups`` groups pending, leased or buffered."""
    missing = ctx.cfg.sync.inflight_limit(ctx.cfg.train.prompts_per_step) - ctx.coord.in_flight()
    if missing > 0:
        add_problems(ctx, missing)


async def _wait_until(ctx, ready, describe, refill=None) -> None:
    """Wait for ``ready()``; meanwhile the last published version's dissemination is timed.
    ``refill()``, when given, runs at every change (e.g. to replace groups dropped meanwhile)."""
    watch: DissemWatch | None = getattr(ctx, "dissem_watch", None)
    async with trio.open_nursery() as nursery:
        if watch is not None:
            nursery.start_soon(watch.run, ctx.service)
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
                        f"{len(ctx.service.nodes)} node(s) joined)")


async def sequential_step(ctx) -> dict[str, Any]:
    t0 = time.perf_counter()
    gen0 = gen_seconds(ctx.service)
    ids = add_problems(ctx, ctx.cfg.train.prompts_per_step)
    coord, queue = ctx.coord, getattr(ctx.service, "checks", None)

    def ready(gid: str) -> bool:  # trainable, or held for a check this step makes on its forward
        state = coord.ledger[gid]
        return state == COMPLETED or (state == HELD and queue is not None and queue.is_deferred(gid))

    idle, t_wait = 0.0, t0
    while True:
        await _wait_until(ctx, lambda: all(ready(g) for g in ids),
                          lambda: f"{sum(ready(g) for g in ids)}/{len(ids)} groups")
        idle += time.perf_counter() - t_wait
        deferred = queue.take_deferred(ids) if queue is not None else []
        groups = coord.take(ids)
        try:
            return await _train_and_publish(ctx, groups, t0, idle, gen0, deferred)
        except ChecksFailed as failed:  # nothing was trained: wait for the failed pushes' replacements
            coord.untake(groups)
            _settle(queue, deferred, failed.failed)  # untrusts their peers: their groups go to others
            ctx.console(f"learner: step {ctx.state.step + 1}: {len(failed.failed)} group(s) failed verification "
                        "on the training forward; training again once other nodes replace them")
            t_wait = time.perf_counter()


async def async_step(ctx) -> dict[str, Any]:
    t0 = time.perf_counter()
    gen0 = gen_seconds(ctx.service)
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
    """The checks the training step makes on its own forward, one per picked group of each
    deferred push (:mod:`learner.step_check`); ``None`` when there are none."""
    if not deferred:
        return None
    v = queue.verifier
    return StepChecks([GroupCheck(gid, len(result.completions), partial(v.judge_scored, item.peer_id, item.backend, result))
                       for item in deferred for gid, _prompt, result in item.picked])


def _settle(queue, deferred: list, failed: dict[str, str]) -> None:
    """The verdicts on the deferred pushes of a step: a push with a failed group (``failed``:
    group id -> reason) untrusts its peer; the others are credited."""
    for item in deferred:
        failure = next(((gid, failed[gid]) for gid, _p, _r in item.picked if gid in failed), None)
        queue.settle(item, failure)


async def _train(ctx, samples: list, queue, deferred: list) -> dict:
    """The GRPO update (in a worker thread), verifying the deferred pushes' picked groups on its
    forward; raises :class:`~learner.step_check.ChecksFailed` when one fails (nothing trained)."""
    checks = _step_checks(queue, deferred)
    if checks is None:
        return await trio.to_thread.run_sync(ctx.train, samples)
    try:
        stats = await trio.to_thread.run_sync(partial(ctx.train, samples, checks=checks))
    finally:
        queue.verifier.add_cost(checks.seconds, checks.judged)
    _settle(queue, deferred, {})
    return stats


async def _train_and_publish(ctx, groups: list[CompletedGroup], t0: float, idle: float,
                             gen0: dict[str, float] | None = None, deferred: list | None = None) -> dict[str, Any]:
    state = ctx.state
    clock, watch = StepClock(t0, idle), getattr(ctx, "dissem_watch", None)  # watch: the version these rollouts waited for
    with clock.part("reward"):
        samples, rewards = score_groups(groups, ctx.task, ctx.tokenizer)
    check: dict[str, float] = {}
    if ctx.cfg.train.behaviour_check:  # learner/behaviour_check.py
        with clock.part("check"):
            check = await trio.to_thread.run_sync(behaviour_diffs, ctx.trainer, groups, ctx.service.node_backends())
    t1 = time.perf_counter()
    stats = await _train(ctx, samples, getattr(ctx.service, "checks", None), deferred or [])
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
    ctx.dissem_watch = DissemWatch.start(ctx.service, state.version)
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
        "trained_groups": dict(Counter(g.peer_id for g in groups)),  # the work ledger's (learner/ledger.py)
        "completions": shown,
        "rollout_versions": sorted({g.result.version for g in groups}),
        "staleness_hist": {str(k): v for k, v in sorted(lags.items())},
        "staleness_max": max(lags, default=0),
        "dropped": ctx.coord.take_drop_counts(),
        "buffer_groups": len(ctx.coord.completed),
        "mean_completion_tokens": sum(len(c.token_ids) for c in comps) / len(comps),
        "stop_frac": sum(c.finish_reason == "stop" for c in comps) / len(comps),
        **check,
        **clock.fields(step_time, gen_seconds(ctx.service), gen0 or {}, watch),
    }
