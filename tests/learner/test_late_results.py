"""A result beaten by a backup lease's (``lease_rules``: a proven peer generates a newcomer's group
when the newcomer is slow) is refused as already completed, never trained, but through the real
push handler it is still checked when its peer has passed no check yet: a slow cheater is caught
all the same, an honest slow newcomer comes off probation, and either way the late result answers
its lease (the peer is not left holding it until it expires)."""

from __future__ import annotations

import pytest
import trio

from learner.coordinator import COMPLETED
from learner.steps import _wait_until
from swarm.proto.rollouts import Completion, GroupResult, RolloutPush
from swarm.proto.work import WorkRequest
from tests.learner.test_verify_after_ack import CHEAT_TOKEN, generate_and_push, join, setup, step_ctx


def open_gate(n_groups: int):
    """A service whose checks score at once; (service, verifier, coordinator)."""
    svc, v = setup(n_groups=n_groups)
    v.gate.set()
    return svc, v, svc.coordinator


@pytest.mark.parametrize("token", [5, CHEAT_TOKEN], ids=["honest", "cheat"])
def test_a_late_result_of_a_newcomer_is_checked_and_answers_its_lease(token):
    svc, v, coord = open_gate(1)

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(svc.verify_loop)
            await join(svc, "slow", "fast")
            lease = (await svc.on_work(WorkRequest(have_version=-1, max_groups=1), "slow")).lease
            assert lease is not None and coord.ledger.leases_held("slow") == 1
            coord.probation.proven.add("fast")  # a proven peer that returns its leases at once
            coord.probation.turnarounds.append(0.0)
            g0, ack = await generate_and_push(svc, "fast")  # its backup lease of the slow one's group
            assert g0 == lease.groups[0].group_id and ack.accepted_groups == 1
            with trio.fail_after(5):
                await _wait_until(step_ctx(svc), lambda: coord.ledger[g0] == COMPLETED, lambda: "")
            late = GroupResult(g0, lease.version, [Completion([token, token], [-1.0, -1.0], "stop")] * 2)
            ack = await svc.on_rollouts(RolloutPush(lease.lease_id, [late], gen_s=9.0, gen_tokens=4), "slow")
            assert ack.accepted_groups == 0 and ack.rejections == {g0: "already_completed"}
            assert coord.ledger.leases_held("slow") == 0  # answered: free to take new work
            with trio.fail_after(5):
                while coord.probation.on_probation("slow") and "slow" not in svc.admission.untrusted:
                    await svc.wait_changed()
            if token == CHEAT_TOKEN:
                assert svc.admission.untrusted["slow"].startswith(f"unverified: group {g0}: claimed log-probs differ")
            else:
                assert svc.admission.untrusted == {}
            # a second late copy is not checked again: its group is no longer open in the lease
            assert coord.late_results("slow", lease.lease_id, [late]) == []
            assert [g.peer_id for g in coord.take([g0])] == ["fast"]  # only the first result trains
            assert svc.take_contributions() == {"fast": 2}
            svc.finish()
        assert v.take_metrics()["verify_failed"] == (token == CHEAT_TOKEN)

    trio.run(main)


def test_a_late_result_of_a_peer_with_a_passed_check_is_not_checked_again():
    svc, _v, coord = open_gate(2)

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(svc.verify_loop)
            await join(svc, "slow", "fast")
            await generate_and_push(svc, "slow")
            with trio.fail_after(5):
                while coord.probation.on_probation("slow"):
                    await svc.wait_changed()
            assert svc.checks is not None and "slow" in svc.checks.proven
            g = GroupResult("g0", 0, [Completion([5, 5], [-1.0, -1.0], "stop")] * 2)
            assert not svc.checks.check_late("slow", [g])  # its checks are sampled like any proven peer's
            svc.finish()

    trio.run(main)
