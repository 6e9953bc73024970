"""The service's side of in-step verification (learner/verify_queue.py, learner/steps.py): a
picked push of the current version is left to the training step instead of the background
worker; the step's wait counts it as ready; a pass credits the peer; a failure abandons the
step, untrusts the peer and sends its groups to other nodes before the step trains again."""

from __future__ import annotations

import types

import trio

from learner.coordinator import COMPLETED, HELD, PENDING, TRAINED
from learner.steps import _settle, _step_checks
from tests.learner.test_verify_after_ack import generate_and_push, join, setup


def in_step_setup(n_groups: int = 2):
    svc, v = setup(n_groups=n_groups)
    v.in_step = True
    return svc, v


def run_step_checks(svc, ids, verdicts):
    """What sequential_step does around the training call: take the deferred checks and the
    groups, judge each picked group as ``verdicts`` says (the training forward's part), then
    settle: on a failure the step is abandoned (groups untaken, failing peers untrusted)."""
    queue, coord = svc.checks, svc.coordinator
    deferred = queue.take_deferred(ids)
    groups = coord.take(ids)
    checks = _step_checks(queue, deferred)
    failed = {c.group_id: verdicts[c.group_id] for c in (checks.checks if checks else []) if verdicts.get(c.group_id)}
    if failed:
        coord.untake(groups)
    _settle(queue, deferred, failed)
    return deferred, checks, failed


def test_a_picked_push_of_the_current_version_waits_for_the_step_not_the_worker():
    svc, v = in_step_setup()
    coord = svc.coordinator

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(svc.verify_loop)
            await join(svc, "A")
            g0, ack = await generate_and_push(svc, "A")
            g1, _ = await generate_and_push(svc, "A")  # not picked: joins the same hold
            assert ack.accepted_groups == 1
            await trio.sleep(0.3)
            assert not v.started.is_set()  # the worker never scores it
            assert coord.ledger[g0] == HELD and coord.ledger[g1] == HELD
            assert svc.checks.is_deferred(g0) and svc.checks.is_deferred(g1) and len(svc.checks) == 0
            assert svc.take_contributions() == {}
            deferred, checks, failed = run_step_checks(svc, [g0, g1], {})
            assert [d.peer_id for d in deferred] == ["A"] and len(checks.checks) == 1 and not failed
            assert svc.take_contributions() == {"A": 4}
            assert coord.counts() == {TRAINED: 2}
            svc.finish()

    trio.run(main)


def test_a_failed_in_step_check_untrusts_and_its_groups_go_to_other_nodes():
    """The abandoned step's groups are completed again (the honest push's) or pending again for
    other nodes (the cheater's, dropped as unverified); the next attempt takes them all."""
    svc, v = in_step_setup(n_groups=3)
    coord = svc.coordinator

    async def main() -> None:
        await join(svc, "A", "B")
        g0, _ = await generate_and_push(svc, "A")
        g1, _ = await generate_and_push(svc, "A")
        g2, _ = await generate_and_push(svc, "B")  # B's first group: picked, deferred too
        deferred, checks, failed = run_step_checks(svc, [g0, g1, g2], {g0: "made up"})
        assert failed == {g0: "made up"} and len(deferred) == 2
        assert coord.ledger[g0] == PENDING and coord.ledger[g1] == PENDING  # A's: to other nodes
        assert coord.ledger[g2] == COMPLETED  # B's passed: trainable in the next attempt
        assert "A" in svc.admission.untrusted and svc.take_contributions() == {"B": 2}
        assert coord.take_drop_counts() == {"unverified": 2}
        g, _ = await generate_and_push(svc, "B")  # the re-issued groups go to another node
        assert g in (g0, g1)
        assert svc.checks.is_deferred(g) or coord.ledger[g] == COMPLETED

    trio.run(main)


def test_a_push_of_an_older_version_is_checked_by_the_worker():
    svc, v = in_step_setup()
    v.weights_version = 5  # the push claims version 0: not what the next step trains from

    async def main() -> None:
        await join(svc, "A")
        g0, _ = await generate_and_push(svc, "A")
        assert not svc.checks.is_deferred(g0) and len(svc.checks) == 1

    trio.run(main)
