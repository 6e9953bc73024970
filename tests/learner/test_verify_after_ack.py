"""Verification after the ack (``learner/verify_queue.py``) through the real push handler: the
node's ack does not wait for re-scoring, the push's groups are held until their check passes,
a failed check untrusts the peer and re-issues its held groups, and the end of a run does not
wait for a check in progress. The scoring is replaced by fixed numbers that block on an event."""

from __future__ import annotations

import threading
import types

import numpy as np
import pytest
import trio

from learner.admission import Admission, AdmissionPolicy
from learner.checkpoint import open_problem_refs
from learner.coordinator import COMPLETED, HELD, PENDING, TRAINED, Coordinator, GroupSpec, Limits
from learner.service import LearnerService, Refused, SamplingDefaults, ServiceSettings
from learner.steps import _wait_until
from learner.verify import Scored, Verifier, VerifyConfig
from swarm.proto.hello import Hello
from swarm.proto.rollouts import Completion, GroupResult, RolloutPush
from swarm.proto.work import WorkRequest

CHEAT_TOKEN = 7  # the recomputed log-prob of this token is far from what the pushes claim


class GatedScores(Verifier):
    """Scoring waits for :attr:`gate`; a pushed claim of -1.0 is honest except for ``CHEAT_TOKEN``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.gate, self.started = threading.Event(), threading.Event()
        self.fail_with: Exception | None = None

    def _score(self, prompt_ids, completions, uniforms=None, fp32=False):
        self.started.set()
        assert self.gate.wait(10), "the test never opened the gate"
        if self.fail_with is not None:
            raise self.fail_with
        out = []
        for ids in completions:
            lp = np.array([-3.0 if t == CHEAT_TOKEN else -1.0 for t in ids])
            out.append(Scored(lp, np.ones(len(ids)), np.ones(len(ids))))
        return out


def setup(n_groups: int = 4, first_groups: int = 1) -> tuple[LearnerService, GatedScores]:
    coord = Coordinator(Limits(group_size=2, max_tokens=8, vocab_size=100), lease_timeout_s=60.0, groups_per_lease=1)
    coord.add_groups([GroupSpec(f"g{i}", [1, 2, 3], str(i)) for i in range(n_groups)])
    cfg = VerifyConfig(first_groups=first_groups, sample_frac=0.0, budget_s_per_step=0.0,
                                max_mean_abs_diff={"default": 0.3}, max_abs_z=4.0, surprisal_slack=0.2)
    verifier = GatedScores(trainer=None, cfg=cfg, temperature=1.0, top_p=1.0, weights_version=0)
    svc = LearnerService(coord, ServiceSettings(SamplingDefaults(1.0, 1.0, 8, 0), group_size=2, run_id="r",
                                                model_name="m", long_poll_s=0.2),
                         admission=Admission(AdmissionPolicy()), verifier=verifier)
    return svc, verifier


async def join(svc: LearnerService, *peers: str) -> None:
    for p in peers:
        await svc.on_hello(Hello(backend="llamacpp", device="cpu", memory_bytes=1, tokens_per_s=1.0), p)


async def generate_and_push(svc: LearnerService, peer: str, token: int = 5):
    """Lease one group as ``peer``, push it (its claims: -1.0 per token); returns (group id, ack)."""
    reply = await svc.on_work(WorkRequest(have_version=-1, max_groups=1), peer)
    lease = reply.lease
    assert lease is not None, reply
    groups = [GroupResult(g.group_id, lease.version, [Completion([token, token], [-1.0, -1.0], "stop")] * 2)
              for g in lease.groups]
    with trio.fail_after(2):  # the ack never waits for the (blocked) scoring
        ack = await svc.on_rollouts(RolloutPush(lease.lease_id, groups, gen_s=1.0, gen_tokens=4), peer)
    return lease.groups[0].group_id, ack


def step_ctx(svc: LearnerService):
    return types.SimpleNamespace(service=svc, state=types.SimpleNamespace(step=0), console=lambda s: None,
                                 dissem_watch=None)


def test_the_ack_comes_before_the_check_and_the_batch_waits_for_it():
    svc, v = setup(n_groups=2)
    coord = svc.coordinator

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(svc.verify_loop)
            await join(svc, "A")
            g0, ack = await generate_and_push(svc, "A")
            assert ack.accepted_groups == 1 and ack.rejections == {}
            assert await trio.to_thread.run_sync(v.started.wait, 5)  # the check runs, blocked
            assert coord.ledger[g0] == HELD and coord.ready() == 0 and coord.completed_ids() == []
            assert svc.take_contributions() == {}  # credited once verified
            # the node took new work and pushed it meanwhile: every group is checked before it trains
            g1, ack = await generate_and_push(svc, "A")
            assert ack.accepted_groups == 1 and coord.ledger[g1] == HELD and coord.ready() == 0
            # a sequential step's wait for its batch (learner/steps.py) sees neither until the check ends
            batch_ready = trio.Event()

            async def step_wait() -> None:
                await _wait_until(step_ctx(svc), lambda: all(coord.ledger[g] == COMPLETED for g in (g0, g1)),
                                  lambda: "")
                batch_ready.set()

            n.start_soon(step_wait)
            await trio.sleep(0.2)
            assert not batch_ready.is_set()
            v.gate.set()
            with trio.fail_after(5):
                await batch_ready.wait()
            assert [g.peer_id for g in coord.take([g0, g1])] == ["A", "A"]
            assert svc.take_contributions() == {"A": 4}
            m = v.take_metrics()
            assert m["verify_groups"] == 2 and m["verify_failed"] == 0
            svc.finish()
        assert coord.counts() == {TRAINED: 2}

    trio.run(main)


def test_a_failed_check_untrusts_the_peer_and_reissues_its_held_groups_none_trained():
    svc, v = setup(n_groups=2)
    coord = svc.coordinator

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(svc.verify_loop)
            await join(svc, "cheat", "honest")
            g0, ack = await generate_and_push(svc, "cheat", token=CHEAT_TOKEN)
            assert ack.accepted_groups == 1  # accepted: the ack may still be revoked
            g1, _ = await generate_and_push(svc, "cheat", token=CHEAT_TOKEN)  # joins the outstanding hold
            assert coord.ledger[g0] == coord.ledger[g1] == HELD
            v.gate.set()
            with trio.fail_after(5):
                while "cheat" not in svc.admission.untrusted:
                    await svc.wait_changed()
            assert svc.admission.untrusted["cheat"].startswith(f"unverified: group {g0}: claimed log-probs differ")
            assert coord.ledger[g0] == coord.ledger[g1] == PENDING and coord.holds == {}
            assert coord.take_drop_counts() == {"unverified": 2} and "cheat" not in svc.roster
            assert svc.take_contributions() == {}
            # the cheater is refused from now on; the honest node generates both groups again
            with pytest.raises(Refused):  # forgotten: its next request is refused outright ...
                await svc.on_work(WorkRequest(have_version=-1, max_groups=1), "cheat")
            assert not (await svc.on_hello(Hello(backend="llamacpp", device="cpu", memory_bytes=1,
                                                 tokens_per_s=1.0), "cheat")).accepted  # ... and so is its hello
            again = [(await generate_and_push(svc, "honest"))[0] for _ in range(2)]
            assert sorted(again) == sorted([g0, g1])
            with trio.fail_after(5):  # the honest node's check passes (gate open)
                await _wait_until(step_ctx(svc), lambda: coord.ready() == 2, lambda: "")
            assert {g.peer_id for g in coord.take(again)} == {"honest"}
            svc.finish()
        assert coord.counts() == {TRAINED: 2}
        assert v.take_metrics()["verify_failed"] == 1

    trio.run(main)


def test_a_check_that_cannot_run_reissues_the_push_without_blaming_the_peer():
    svc, v = setup(n_groups=1)
    v.fail_with = RuntimeError("out of memory")
    v.gate.set()
    coord = svc.coordinator

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(svc.verify_loop)
            await join(svc, "A")
            g0, _ = await generate_and_push(svc, "A")
            with trio.fail_after(5):
                while coord.ledger[g0] == HELD:
                    await svc.wait_changed()
            assert coord.ledger[g0] == PENDING and coord.take_drop_counts() == {"verify_error": 1}
            assert svc.admission.untrusted == {} and "A" in svc.roster
            assert coord.lease("A", 1, now=trio.current_time()).group_ids == [g0]
            svc.finish()

    trio.run(main)


def test_the_end_of_the_run_does_not_wait_for_a_check_in_progress():
    svc, v = setup(n_groups=2)
    coord = svc.coordinator

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(svc.verify_loop)
            await join(svc, "A")
            g0, _ = await generate_and_push(svc, "A")
            assert await trio.to_thread.run_sync(v.started.wait, 5)
            t0 = trio.current_time()
            svc.finish()  # the worker and its blocked check are abandoned at once
        assert trio.current_time() - t0 < 1.0
        assert coord.ledger[g0] == HELD and open_problem_refs(coord) == ["0", "1"]  # untrained, re-issued on resume

    try:
        trio.run(main)
    finally:
        v.gate.set()  # let the abandoned scoring thread end


def test_pushes_that_queue_up_meanwhile_are_checked_one_by_one_in_arrival_order():
    """While one check runs, two other nodes' pushes queue up; the worker then checks each on its
    own, in arrival order (so a training step can still take the latest ones for its own forward):
    the honest one is released, the cheater untrusted."""
    svc, v = setup(n_groups=3)
    coord = svc.coordinator
    calls: list[int] = []
    rescore_groups = v.rescore_groups
    v.rescore_groups = lambda groups: calls.append(len(groups)) or rescore_groups(groups)

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(svc.verify_loop)
            await join(svc, "A", "B", "cheat")
            ga, _ = await generate_and_push(svc, "A")
            assert await trio.to_thread.run_sync(v.started.wait, 5)  # A's check runs, blocked
            gb, _ = await generate_and_push(svc, "B")
            gc, _ = await generate_and_push(svc, "cheat", token=CHEAT_TOKEN)
            assert len(svc.checks) == 2
            v.gate.set()
            with trio.fail_after(5):
                while coord.ready() < 2 or "cheat" not in svc.admission.untrusted:
                    await svc.wait_changed()
            assert calls == [1, 1, 1]
            assert coord.ledger[ga] == coord.ledger[gb] == COMPLETED and coord.ledger[gc] == PENDING
            assert svc.take_contributions() == {"A": 2, "B": 2}
            svc.finish()

    trio.run(main)


def test_checks_of_new_peers_spend_their_budget_and_never_more():
    """Fresh ids each push a group: the worker checks new peers' pushes while the step's budget for
    them (``verify.newcomer_s_per_step``) lasts; beyond it a new peer's push is re-issued unchecked
    (nobody blamed, not handed back to it, nothing trained), while a proven peer's are checked."""
    svc, v = setup(n_groups=6)
    svc.checks.newcomers = type(svc.checks.newcomers)(1e-6, keep_steps=1)  # about one check
    coord = svc.coordinator
    v.gate.set()

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(svc.verify_loop)
            await join(svc, "A", "fresh-1", "fresh-2")
            ga, _ = await generate_and_push(svc, "A")
            with trio.fail_after(5):
                while coord.ledger[ga] != COMPLETED:
                    await svc.wait_changed()
            g1, _ = await generate_and_push(svc, "fresh-1")
            g2, _ = await generate_and_push(svc, "fresh-2")
            with trio.fail_after(5):
                while HELD in (coord.ledger[g1], coord.ledger[g2]):
                    await svc.wait_changed()
            assert coord.ledger[g1] == coord.ledger[g2] == PENDING  # the budget was A's: re-issued unchecked
            assert "fresh-1" in coord.refused_by[g1] and not svc.admission.untrusted
            assert svc.checks.new_step() == {"verify_unchecked": 2}
            g3, _ = await generate_and_push(svc, "A")  # a proven peer is checked whatever the budget
            with trio.fail_after(5):
                while coord.ledger[g3] != COMPLETED:
                    await svc.wait_changed()
            svc.finish()

    trio.run(main)
