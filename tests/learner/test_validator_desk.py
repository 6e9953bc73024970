"""Validator nodes at work (``learner/validator_desk.py``): blind jobs handed out through the work
long poll, answers taken only from the peer a job went to, exact comparison, the referee on a
disagreement, and the fall-back to the statistical check. Validators here are trio tasks that
answer jobs with fixed tokens; real nodes answer in ``tests/integration/test_validators.py``."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from learner.config import ValidatorConfig
from learner.validator_desk import FALLBACK, ValidatorDesk
from learner.work_desk import SamplingDefaults
from swarm.config import ConfigError
from swarm.proto.rollouts import Completion, GroupResult
from swarm.proto.validate import ValidateResult
from swarm.proto.work import group_seed

HONEST = [5, 6, 7]
SAMPLING = SamplingDefaults(0.9, 0.95, 16, 1234)


def group(tokens, n=2, version=3, mask=()):
    return GroupResult("g-secret", version, [Completion(list(tokens), [-1.0] * len(tokens), "stop", list(mask))] * n)


def make(classes, deadline_s=30.0, untrusted=None, woken=None):
    untrusted = untrusted if untrusted is not None else {}
    return ValidatorDesk(ValidatorConfig(deadline_s=deadline_s), SAMPLING, classes=lambda: classes,
                         untrust=lambda p, why: untrusted.__setitem__(p, why),
                         wake=lambda: woken.append(1) if woken is not None else None, rng=random.Random(1))


async def serve(desk, peer, tokens, seen=None, logprob=-1.0):
    """A validator: polls for its jobs and answers each with ``tokens`` per completion."""
    while True:
        job = desk.job_for(peer)
        if job is None:
            await trio.sleep(0.05)
            continue
        if seen is not None:
            seen.append(job)
        comps = [Completion(list(tokens), [logprob] * len(tokens), "stop")] * job.group_size
        assert desk.deliver(peer, ValidateResult(job.request_id, comps))


async def run_check(desk, validators, pushed, producer="p"):
    async with trio.open_nursery() as nursery:
        for peer, tokens, seen in validators:
            nursery.start_soon(serve, desk, peer, tokens, seen)
        got = await desk.check(producer, "g-secret", [1, 2, 3], pushed)
        nursery.cancel_scope.cancel()
    return got


CLASSES = {"p": "torch|A", "v1": "torch|A", "v2": "torch|A", "x": "mlx|B"}


def test_an_honest_group_is_confirmed_by_a_blind_job():
    async def main():
        woken, seen = [], []
        desk = make({"p": "torch|A", "v1": "torch|A", "x": "mlx|B"}, woken=woken)
        assert desk.choose("p", group(HONEST))
        assert await run_check(desk, [("v1", HONEST, seen)], group(HONEST)) is None
        job = seen[0]
        assert woken  # the long polls were woken for the job
        assert "g-secret" not in repr(job) and "p" not in (job.request_id,)  # no group id, no producer
        assert (job.prompt_ids, job.version, job.group_size, job.seed) == ([1, 2, 3], 3, 2, group_seed(1234, "g-secret"))
        assert (job.temperature, job.top_p, job.max_tokens) == (0.9, 0.95, 16)
        m = desk.take_metrics()
        assert m["validator_groups"] == 1 and m["validator_failed"] == 0 and m["validator_fallback"] == 0
        assert desk.take_metrics()["validator_groups"] == 0  # per step

    trio.run(main)


def test_a_cheater_disagreeing_with_two_validators_fails_the_group():
    async def main():
        desk = make(CLASSES)
        why = await run_check(desk, [("v1", HONEST, None), ("v2", HONEST, None)], group([5, 9, 7]))
        assert why.startswith("validator: completion 0 leaves the replay at token 1")
        m = desk.take_metrics()
        assert (m["validator_groups"], m["validator_failed"], m["validator_disagreements"]) == (1, 1, 1)

    trio.run(main)


def test_a_lying_validator_is_untrusted_and_the_producer_passes():
    async def main():
        untrusted = {}
        desk = make(CLASSES, untrusted=untrusted)
        got = await run_check(desk, [("v1", [9, 9], None), ("v2", HONEST, None)], group(HONEST))
        assert got is None and set(untrusted) == {"v1"}
        assert desk.take_metrics()["validator_untrusted"] == 1

    trio.run(main)


def test_three_different_answers_untrust_nobody_and_fall_back():
    async def main():
        untrusted = {}
        desk = make(CLASSES, untrusted=untrusted)
        got = await run_check(desk, [("v1", [9, 9], None), ("v2", [8, 8], None)], group(HONEST))
        assert got == FALLBACK and not untrusted
        m = desk.take_metrics()
        assert m["validator_inconclusive"] == 1 and m["validator_fallback"] == 1 and m["validator_groups"] == 0

    trio.run(main)


def test_a_disagreement_without_a_second_validator_falls_back():
    async def main():
        desk = make({"p": "torch|A", "v1": "torch|A"})
        assert await run_check(desk, [("v1", HONEST, None)], group([5, 9, 7])) == FALLBACK

    trio.run(main)


def test_log_probs_must_agree_within_the_tolerance():
    async def main():
        desk = make({"p": "torch|A", "v1": "torch|A"})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve, desk, "v1", HONEST, None, -1.0005)
            assert await desk.check("p", "g", [1], group(HONEST)) is None  # within 1e-3
            nursery.cancel_scope.cancel()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve, desk, "v1", HONEST, None, -1.1)
            assert await desk.check("p", "g", [1], group(HONEST)) == FALLBACK  # disagrees; no referee
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_no_validator_of_the_class_or_a_multi_turn_group_is_not_chosen():
    desk = make({"p": "torch|A", "x": "mlx|B", "n": None})
    assert not desk.choose("p", group(HONEST))
    assert not desk.choose("n", group(HONEST))
    assert not make(CLASSES).choose("p", group(HONEST, mask=[1, 0, 1]))
    off = ValidatorDesk(ValidatorConfig(enabled=False), SAMPLING, classes=lambda: CLASSES, untrust=lambda p, w: None,
                        wake=lambda: None)
    assert not off.choose("p", group(HONEST))


def test_a_silent_validator_times_out_to_the_statistical_check():
    async def main():
        desk = make({"p": "torch|A", "v1": "torch|A"}, deadline_s=5.0)
        assert await desk.check("p", "g", [1], group(HONEST)) == FALLBACK
        assert desk.job_for("v1") is None  # the job is withdrawn with its deadline
        assert desk.take_metrics()["validator_fallback"] == 1

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_answers_only_from_the_peer_holding_the_job_once():
    async def main():
        desk = make({"p": "torch|A", "v1": "torch|A"})
        results = []
        async with trio.open_nursery() as nursery:
            async def ask():
                results.append(await desk.check("p", "g", [1], group(HONEST)))
            nursery.start_soon(ask)
            await trio.sleep(0.01)
            bogus = ValidateResult("nope", [])
            assert not desk.deliver("v1", bogus)  # unknown id
            job = desk.job_for("v1")
            assert desk.job_for("v1") is None  # handed out once
            good = ValidateResult(job.request_id, [Completion(HONEST, [-1.0] * 3, "stop")] * 2)
            assert not desk.deliver("p", good)  # not the peer it went to
            assert desk.deliver("v1", good)
            assert not desk.deliver("v1", good)  # only once
        assert results == [None]

    trio.run(main)


def test_a_validator_error_falls_back_and_the_config_is_checked():
    async def main():
        desk = make({"p": "torch|A", "v1": "torch|A"})
        async with trio.open_nursery() as nursery:
            async def failing():
                while (job := desk.job_for("v1")) is None:
                    await trio.sleep(0.01)
                desk.deliver("v1", ValidateResult(job.request_id, [], error="ValueError: adapter v3 not kept"))
            nursery.start_soon(failing)
            assert await desk.check("p", "g", [1], group(HONEST)) == FALLBACK

    trio.run(main)
    for bad in (dict(deadline_s=0), dict(max_logprob_diff=float("nan")), dict(max_jobs_per_peer=0)):
        with pytest.raises(ConfigError):
            ValidatorConfig(**bad)


def test_validator_waits_are_bounded_per_step_by_the_budget():
    """A node's first group always goes to a validator; later ones while the step's credit lasts,
    each charged the last measured wait; a new step adds credit (never more than one step's)."""
    desk = ValidatorDesk(ValidatorConfig(budget_s_per_step=10.0, first_groups=1), SAMPLING,
                         classes=lambda: CLASSES, untrust=lambda p, why: None, wake=lambda: None)
    g = group(HONEST)
    assert desk.choose("p", g)  # first group: always, never charged
    desk.budget.measured(25.0)  # one validator wait took 25 s
    assert desk.choose("p", g)  # credit 10 > 0: sent, leaves a debt of 15
    assert not desk.choose("p", g)
    assert desk.take_metrics()["validator_budget_s"] == -5.0  # one step's credit pays part of the debt
    assert not desk.choose("p", g)
    desk.take_metrics()
    assert desk.choose("p", g)
    unlimited = ValidatorDesk(ValidatorConfig(budget_s_per_step=0.0, first_groups=0), SAMPLING,
                              classes=lambda: CLASSES, untrust=lambda p, why: None, wake=lambda: None)
    unlimited.budget.measured(1000.0)
    assert all(unlimited.choose("p", g) for _ in range(5))
    with pytest.raises(ConfigError, match="budget_s_per_step"):
        ValidatorConfig(budget_s_per_step=float("inf"))
    with pytest.raises(ConfigError, match="first_groups"):
        ValidatorConfig(first_groups=-1)
