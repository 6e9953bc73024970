"""Validator nodes at work (``learner/validator_desk.py``): blind jobs handed out through the work
long poll, answers taken only from the peer a job went to, exact comparison, a disagreement handed
to the learner's own checks (never decided by validators), and a validator that disagrees with
those checks losing its role. Validators here are trio tasks that answer jobs with fixed tokens;
real nodes answer in ``tests/integration/test_validators.py``."""

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
        assert await run_check(desk, [("v1", HONEST, seen)], group(HONEST)) == ("v1", None)
        job = seen[0]
        assert woken  # the long polls were woken for the job
        assert "g-secret" not in repr(job) and "p" not in (job.request_id,)  # no group id, no producer
        assert (job.prompt_ids, job.version, job.group_size, job.seed) == ([1, 2, 3], 3, 2, group_seed(1234, "g-secret"))
        assert (job.temperature, job.top_p, job.max_tokens) == (0.9, 0.95, 16)
        m = desk.take_metrics()
        assert m["validator_groups"] == 1 and m["validator_agreed"] == 1 and m["validator_fallback"] == 0
        assert desk.take_metrics()["validator_groups"] == 0  # per step

    trio.run(main)


def test_a_disagreement_is_handed_to_the_learners_checks_and_decides_nothing_itself():
    async def main():
        untrusted = {}
        desk = make(CLASSES, untrusted=untrusted)
        validator, replay = await run_check(desk, [("v1", HONEST, None), ("v2", HONEST, None)], group([5, 9, 7]))
        assert validator in ("v1", "v2") and [c.token_ids for c in replay.completions] == [HONEST, HONEST]
        assert replay.group_id == "g-secret" and replay.version == 3  # for the learner's draw check of it
        assert not untrusted  # the validator's word alone untrusts nobody
        m = desk.take_metrics()
        assert (m["validator_groups"], m["validator_disagreements"], m["validator_untrusted"]) == (1, 1, 0)

    trio.run(main)


@pytest.mark.parametrize("why_validator, why_producer, outcome", [
    ("draw check: tokens not drawn by the lease's seed", None, "validator"),
    (None, "draw check (torch-fp32, fp32): ...", "producer"),
    ("draw check: ...", "draw check: ...", "validator"),
    (None, None, "demote"),
])
def test_the_learners_own_checks_settle_a_dispute(why_validator, why_producer, outcome):
    untrusted = {}
    desk = make(CLASSES, untrusted=untrusted)
    assert desk.settle_dispute("v1", "p", "g", why_validator, why_producer) == outcome
    assert set(untrusted) == ({"v1"} if outcome == "validator" else set())  # the producer: by the verify queue
    assert ("v1" in desk.demoted) is (outcome == "demote")
    if outcome == "demote":  # a validator that disagreed with the learner's own check gets no more jobs
        assert not make({"p": "torch|A", "v1": "torch|A"}).demoted
        desk2 = make({"p": "torch|A", "v1": "torch|A"})
        desk2.settle_dispute("v1", "p", "g", None, None)
        assert not desk2.choose("p", group(HONEST))


def test_log_probs_must_agree_within_the_tolerance():
    async def main():
        desk = make({"p": "torch|A", "v1": "torch|A"})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve, desk, "v1", HONEST, None, -1.0005)
            assert await desk.check("p", "g", [1], group(HONEST)) == ("v1", None)  # within 1e-3
            nursery.cancel_scope.cancel()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve, desk, "v1", HONEST, None, -1.1)
            validator, replay = await desk.check("p", "g", [1], group(HONEST))  # differs: the learner decides
            assert validator == "v1" and replay.completions[0].logprobs == [-1.1] * 3
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


def test_a_silent_validator_times_out():
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
        assert results == [("v1", None)]

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
    """Every group sent to a validator is charged the last measured wait, a node's first too; a new
    step adds credit (never more than ``burst_steps`` steps')."""
    desk = ValidatorDesk(ValidatorConfig(budget_s_per_step=10.0, burst_steps=1), SAMPLING,
                         classes=lambda: CLASSES, untrust=lambda p, why: None, wake=lambda: None)
    g = group(HONEST)
    assert desk.choose("p", g)  # credit 10 > 0: sent
    desk.budget.measured(25.0)  # that wait took 25 s: a debt of 15
    assert not desk.choose("new-peer", g)  # a new node's first group is charged like any other
    assert desk.take_metrics()["validator_budget_s"] == -5.0  # one step's credit pays part of the debt
    assert not desk.choose("p", g)
    desk.take_metrics()
    assert desk.choose("p", g)
    unlimited = ValidatorDesk(ValidatorConfig(budget_s_per_step=0.0), SAMPLING,
                              classes=lambda: CLASSES, untrust=lambda p, why: None, wake=lambda: None)
    unlimited.budget.measured(1000.0)
    assert all(unlimited.choose("p", g) for _ in range(5))
    with pytest.raises(ConfigError, match="budget_s_per_step"):
        ValidatorConfig(budget_s_per_step=float("inf"))
    with pytest.raises(ConfigError, match="burst_steps"):
        ValidatorConfig(burst_steps=0)
