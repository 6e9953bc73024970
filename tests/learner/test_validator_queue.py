"""Validators through the service (``learner/service.py`` + ``learner/verify_queue.py`` +
``learner/validator_desk.py``): a picked group of a torch node is decided by the learner's own
checks; it is also handed as a blind job to a node of the same class in the reply to its work long
poll, the answer comes back on the validate handler, and a replay that differs is settled by the
learner's own checks of both sides: validators never untrust, pass or hold a group themselves. The
nodes are trio tasks calling the handlers; real node processes are in
``tests/integration/test_validators.py`` and ``tests/integration/test_draw_cheaters.py``."""

from __future__ import annotations


import numpy as np
import trio

from learner.admission import Admission, AdmissionPolicy
from learner.coordinator import Coordinator, GroupSpec, Limits
from learner.service import LearnerService, Refused, SamplingDefaults, ServiceSettings
from learner.config import ValidatorConfig, VerifyConfig
from learner.verify import Scored, Verifier
from swarm.proto.hello import Hello
from swarm.proto.rollouts import Completion, GroupResult, RolloutPush
from swarm.proto.validate import ValidateResult
from swarm.proto.work import WorkRequest

HONEST = [5, 5]
TORCH = {"build": "torch 2.9 cpu", "dtype": "float32", "max_group": "8"}


class FixedScores(Verifier):
    """Every claim (-1.0) matches; the draw check finds token 5 where its uniform fell, any other
    token far from it (0.9 of probability mass)."""

    def _score(self, prompt_ids, completions, uniforms=None, fp32=False):
        self.fp32_passes = getattr(self, "fp32_passes", 0) + int(fp32)
        return [Scored(np.full(len(ids), -1.0), np.ones(len(ids)), np.ones(len(ids)),
                       None if uniforms is None else np.array([0.0 if t == 5 else 0.9 for t in ids]))
                for ids in completions]


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


def run(svc, producers: dict[str, list[int]], validators: dict[str, list[int]], until, within_s: float = 20):
    """The verify worker, validator nodes answering with their tokens, each producer's push; then
    wait for ``until()``. Returns (group id per producer, jobs handed out)."""
    async def main():
        jobs: list = []
        gids = {}
        for peer in (*producers, *validators):
            await hello(svc, peer)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(svc.verify_loop)
            for v, tokens in validators.items():
                nursery.start_soon(validator, svc, v, tokens, jobs)
            for p, tokens in producers.items():
                gids[p] = await push(svc, p, tokens)
            with trio.fail_after(within_s):
                while not until(gids):
                    await trio.sleep(0.01)
            svc.finish()
            nursery.cancel_scope.cancel()
        return gids, jobs
    return trio.run(main)


def test_the_learners_own_check_decides_and_an_agreeing_validator_only_corroborates():
    svc = setup()
    gids, jobs = run(svc, {"p-honest": HONEST}, {"v1": HONEST},
                     until=lambda g: svc.ledger.summary().get("p-honest", {}).get("verified", {}).get("validator"))
    work = svc.ledger.summary()
    assert work["p-honest"]["verified"] == {"fp32": 1, "validator": 1}  # its own check, then a validator agreed
    assert svc.coordinator.ledger[gids["p-honest"]] == "completed" and not svc.admission.untrusted
    assert all(j.request_id not in gids.values() for j in jobs) and len(jobs) == 1  # blind
    assert svc.verifier.fp32_passes == 1  # a torch fp32 node under a bf16 learner: its first group in float32


def test_a_cheater_is_caught_by_the_learners_own_check_whatever_its_validators():
    svc = setup()
    gids, jobs = run(svc, {"p-cheat": [5, 9]}, {"v1": HONEST, "accomplice": [5, 9]},
                     until=lambda g: "p-cheat" in svc.admission.untrusted)
    why = svc.admission.untrusted["p-cheat"]
    assert f"unverified: group {gids['p-cheat']}: draw check (torch-fp32, fp32)" in why
    assert svc.ledger.summary()["p-cheat"]["failed"] == {"fp32": 1} and set(svc.admission.untrusted) == {"p-cheat"}
    assert svc.coordinator.ledger[gids["p-cheat"]] in ("pending", "leased")  # re-issued


def test_validators_answering_from_a_table_can_neither_untrust_the_honest_nor_pass_anything():
    """Two Sybil validators of the producer's class answer every job from one table: their replays
    fail the learner's draw check, so they are untrusted; the honest producer keeps its trust and
    its group."""
    svc = setup()
    gids, jobs = run(svc, {"p-honest": HONEST}, {"sybil-1": [9, 9], "sybil-2": [9, 9]},
                     until=lambda g: svc.admission.untrusted)
    assert list(svc.admission.untrusted) in (["sybil-1"], ["sybil-2"])
    assert "not drawn from the job's seed" in next(iter(svc.admission.untrusted.values()))
    assert svc.coordinator.ledger[gids["p-honest"]] == "completed"
    assert svc.validators.take_metrics()["validator_untrusted"] == 1


def test_a_validator_whose_replay_passes_but_disagrees_with_the_learners_check_loses_its_role():
    svc = setup()
    gids, jobs = run(svc, {"p-honest": HONEST}, {"v-odd": [5, 5, 5]},
                     until=lambda g: svc.validators.demoted)
    assert svc.validators.demoted == {"v-odd"} and not svc.admission.untrusted
    assert svc.coordinator.ledger[gids["p-honest"]] == "completed"
    assert not svc.validators.choose("p-honest", GroupResult("g", 0, [Completion(HONEST, [-1.0] * 2, "stop")] * 2))


def test_a_silent_validator_holds_nothing():
    """The validator never answers (its job waits ``deadline_s``): the producer's group is released
    by the learner's own check at once, and another node's push is checked meanwhile."""
    svc = setup(ValidatorConfig(deadline_s=5.0))

    async def main():
        await hello(svc, "p")
        await hello(svc, "v-silent")
        await hello(svc, "llama", backend="llamacpp", extra={})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(svc.verify_loop)
            g = await push(svc, "p", HONEST)
            await verified(svc, "p", within_s=3)  # well before the validator's deadline
            assert svc.coordinator.ledger[g] == "completed"
            await push(svc, "llama", HONEST)
            await verified(svc, "llama", within_s=3)
            svc.finish()
            nursery.cancel_scope.cancel()
        assert svc.ledger.summary()["llama"]["verified"] == {"draw": 1}
        assert svc.ledger.summary()["p"]["verified"] == {"fp32": 1}

    trio.run(main)
