"""Validators through the service (``learner/service.py`` + ``learner/verify_queue.py`` +
``learner/validator_desk.py``): a picked group of a torch node is handed as a blind job to a node
of the same class in the reply to its work long poll, the answer comes back on the validate
handler, and the verify queue releases, untrusts (with ``validator`` as the test in the work
ledger) or falls back to re-scoring. The nodes are trio tasks calling the handlers; real node
processes are in ``tests/integration/test_validators.py``."""

from __future__ import annotations


import numpy as np
import trio

from learner.admission import Admission, AdmissionPolicy
from learner.coordinator import Coordinator, GroupSpec, Limits
from learner.service import LearnerService, Refused, SamplingDefaults, ServiceSettings
from learner.config import ValidatorConfig
from learner.verify import Scored, Verifier
from swarm.proto.hello import Hello
from swarm.proto.rollouts import Completion, GroupResult, RolloutPush
from swarm.proto.validate import ValidateResult
from swarm.proto.work import WorkRequest

HONEST = [5, 5]
TORCH = {"build": "torch 2.9 cpu", "dtype": "float32", "max_group": "8"}


class FixedScores(Verifier):
    def _score(self, prompt_ids, completions):
        return [Scored(np.full(len(ids), -1.0), np.ones(len(ids)), np.ones(len(ids))) for ids in completions]


def setup(validators: ValidatorConfig | None = None):
    coord = Coordinator(Limits(group_size=2, max_tokens=8, vocab_size=100), lease_timeout_s=60.0, groups_per_lease=1)
    coord.add_groups([GroupSpec(f"g{i}", [1, 2, 3], str(i)) for i in range(8)])
    cfg = VerifyConfig(first_groups=5, sample_frac=0.0, budget_s_per_step=0.0,
                       max_mean_abs_diff={"default": 0.3}, max_abs_z=100.0, surprisal_slack=0.2)
    verifier = FixedScores(trainer=None, cfg=cfg, temperature=1.0, top_p=1.0, weights_version=0, in_step=False)
    return LearnerService(coord, ServiceSettings(SamplingDefaults(1.0, 1.0, 8, 0), group_size=2, run_id="r",
                                                 model_name="m", long_poll_s=0.2),
                          admission=Admission(AdmissionPolicy()), verifier=verifier,
                          validators=validators or ValidatorConfig(deadline_s=10.0))


async def hello(svc, peer, backend="torch", extra=TORCH):
    await svc.on_hello(Hello(backend=backend, device="cpu (2 cores)", memory_bytes=1, tokens_per_s=1.0,
                             extra=dict(extra)), peer)


async def push(svc, peer, tokens):
    lease = (await svc.on_work(WorkRequest(have_version=-1, max_groups=1), peer)).lease
    groups = [GroupResult(g.group_id, lease.version, [Completion(list(tokens), [-1.0] * len(tokens), "stop")] * 2)
              for g in lease.groups]
    await svc.on_rollouts(RolloutPush(lease.lease_id, groups, gen_s=1.0, gen_tokens=4), peer)
    return lease.groups[0].group_id


async def verified(svc, peer, within_s):
    """Until the work ledger shows a verified group of ``peer`` (at most ``within_s``)."""
    with trio.fail_after(within_s):
        while not svc.ledger.summary().get(peer, {}).get("verified"):
            await trio.sleep(0.01)


async def validator(svc, peer, tokens, jobs):
    """A validator node's work loop: jobs are answered with ``tokens``; leases are left to expire."""
    while True:
        try:
            reply = await svc.on_work(WorkRequest(have_version=0, max_groups=1), peer)
        except Refused:  # untrusted
            return
        if reply.validate is not None:
            job = reply.validate
            jobs.append(job)
            comps = [Completion(list(tokens), [-1.0] * len(tokens), "stop")] * job.group_size
            ack = await svc.on_validate(ValidateResult(job.request_id, comps), peer)
            assert ack.accepted
        else:
            await trio.sleep(0.01)


def test_validators_confirm_the_honest_and_catch_the_cheater():
    async def main():
        svc = setup()
        jobs: list = []
        for peer in ("p-honest", "p-cheat", "v1", "v2"):
            await hello(svc, peer)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(svc.verify_loop)
            for v in ("v1", "v2"):
                nursery.start_soon(validator, svc, v, HONEST, jobs)
            honest = await push(svc, "p-honest", HONEST)
            cheat = await push(svc, "p-cheat", [5, 9])
            for p in ("p-honest", "p-cheat"):  # producers validate others' groups too (honestly)
                nursery.start_soon(validator, svc, p, HONEST, jobs)
            with trio.fail_after(20):
                while "p-cheat" not in svc.admission.untrusted or svc.coordinator.ledger.get(honest) == "held":
                    await trio.sleep(0.01)
            metrics = svc.validators.take_metrics()
            svc.finish()
            nursery.cancel_scope.cancel()
        assert not svc.checks.deferred  # validator groups are never left to the training step
        why = svc.admission.untrusted["p-cheat"]
        assert f"unverified: group {cheat}: validator: completion 0 leaves the replay at token 1" in why
        assert set(svc.admission.untrusted) == {"p-cheat"}
        work = svc.ledger.summary()
        assert work["p-honest"]["verified"] == {"validator": 1} and work["p-cheat"]["failed"] == {"validator": 1}
        assert svc.coordinator.ledger[honest] == "completed"
        assert svc.coordinator.ledger[cheat] in ("pending", "leased")  # re-issued (maybe leased again already)
        assert all(j.request_id not in (honest, cheat) for j in jobs) and len(jobs) == 3  # 1 + a referee pair
        assert metrics["validator_groups"] == 2 and metrics["validator_failed"] == 1

    trio.run(main)


def test_without_a_peer_of_the_class_the_group_is_rescored():
    async def main():
        svc = setup()
        await hello(svc, "p")
        await hello(svc, "other", backend="mlx", extra={**TORCH, "build": "mlx 0.29"})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(svc.verify_loop)
            await push(svc, "p", HONEST)
            await verified(svc, "p", within_s=20)
            svc.finish()
            nursery.cancel_scope.cancel()
        assert svc.ledger.summary()["p"]["verified"] == {"stats": 1}

    trio.run(main)


def test_a_validator_that_never_asks_for_work_times_out_to_rescoring():
    async def main():
        svc = setup(ValidatorConfig(deadline_s=0.5))
        await hello(svc, "p")
        await hello(svc, "v-silent")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(svc.verify_loop)
            await push(svc, "p", HONEST)
            await verified(svc, "p", within_s=20)
            svc.finish()
            nursery.cancel_scope.cancel()
        assert svc.ledger.summary()["p"]["verified"] == {"stats": 1}
        assert svc.validators.take_metrics()["validator_fallback"] == 1
        assert not (await svc.on_validate(ValidateResult("late", []), "v-silent")).accepted  # late or unknown

    trio.run(main)


def test_a_push_waiting_on_a_validator_does_not_hold_up_other_pushes():
    """The validator never answers (its job waits ``deadline_s``); meanwhile another class's push is
    checked and released by the verify worker."""
    async def main():
        svc = setup(ValidatorConfig(deadline_s=5.0))
        await hello(svc, "p")
        await hello(svc, "v-silent")
        await hello(svc, "llama", backend="llamacpp", extra={})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(svc.verify_loop)
            await push(svc, "p", HONEST)
            await trio.sleep(0.1)  # the worker is now waiting on the silent validator
            await push(svc, "llama", HONEST)
            await verified(svc, "llama", within_s=3)  # well before the validator's deadline
            assert not svc.ledger.summary().get("p", {}).get("verified")
            await verified(svc, "p", within_s=20)
            svc.finish()
            nursery.cancel_scope.cancel()
        assert svc.ledger.summary()["llama"]["verified"] == {"stats": 1}
        assert svc.ledger.summary()["p"]["verified"] == {"stats": 1}

    trio.run(main)
