"""The service's side of in-step verification (learner/verify_queue.py, learner/steps.py): pushes
of a proven peer, of the version the step trains from, of the groups the step's first minibatch
holds anyway, are left to the training step's own forward instead of the background worker; the
step's wait counts them as ready; a pass credits the peer; a failure abandons the step, untrusts
the peer and sends its groups to other nodes before the step trains again. A new peer's pushes,
pushes of another version and of the other minibatches' groups are checked by the worker."""

from __future__ import annotations

import trio

from learner.coordinator import COMPLETED, HELD, PENDING, TRAINED
from learner.steps import _settle, _step_checks
from tests.learner.test_verify_after_ack import generate_and_push, join, setup


def in_step_setup(n_groups: int = 2):
    svc, v = setup(n_groups=n_groups)
    v.in_step = True
    return svc, v


async def prove(svc, v, *peers: str) -> list[str]:
    """Each peer's first push, checked by the worker (a peer's pushes are left to a step only once
    one of them passed); returns their group ids, trainable."""
    v.gate.set()
    out = []
    await join(svc, *peers)
    async with trio.open_nursery() as n:
        n.start_soon(svc.verify_loop)
        for p in peers:
            g, _ = await generate_and_push(svc, p)
            with trio.fail_after(5):
                while svc.coordinator.ledger[g] != COMPLETED:
                    await svc.wait_changed()
            out.append(g)
        n.cancel_scope.cancel()
    v.started.clear()
    return out


def run_step_checks(svc, ids, verdicts):
    """What sequential_step does around the training call: take the queued pushes it checks and
    the groups, judge each as ``verdicts`` says (the training forward's part), then settle: on a
    failure the step is abandoned (groups untaken, failing peers untrusted)."""
    queue, coord = svc.checks, svc.coordinator
    deferred = queue.take_for_step()
    groups = coord.take(ids)
    checks = _step_checks(queue, deferred)
    failed = {c.group_id: verdicts[c.group_id] for c in (checks.checks if checks else []) if verdicts.get(c.group_id)}
    if failed:
        coord.untake(groups)
    _settle(queue, deferred, failed)
    return deferred, checks, failed


def test_a_proven_peers_pushes_of_the_first_minibatch_are_checked_on_the_steps_forward():
    svc, v = in_step_setup(n_groups=3)
    coord = svc.coordinator

    async def main() -> None:
        (g0,) = await prove(svc, v, "A")
        g1, _ = await generate_and_push(svc, "A")
        g2, _ = await generate_and_push(svc, "A")
        assert coord.ledger[g1] == HELD and coord.ledger[g2] == HELD and len(svc.checks) == 2
        svc.checks.reserve([g1])  # the step's first minibatch holds g1, not g2: the worker checks g2
        assert not svc.checks.step_ready([g0, g1, g2])
        assert svc.checks._next().picked[0][0] == g2
        svc.checks.reserve([g1, g2])
        assert svc.checks.step_ready([g0, g1, g2]) and svc.checks._next() is None  # both left to the step
        assert svc.take_contributions() == {"A": 2}
        deferred, checks, failed = run_step_checks(svc, [g0, g1, g2], {})
        assert [d.peer_id for d in deferred] == ["A", "A"] and len(checks.checks) == 2 and not failed
        assert all(c.uniforms is not None and len(c.uniforms) == 2 for c in checks.checks)  # the draw check's
        assert not v.started.is_set()  # the worker never scored them
        assert svc.take_contributions() == {"A": 4}
        assert coord.counts() == {TRAINED: 3}
        svc.finish()

    trio.run(main)


def test_a_failed_in_step_check_untrusts_and_its_groups_go_to_other_nodes():
    """The abandoned step's groups are completed again (the honest push's) or pending again for
    other nodes (the cheater's, dropped as unverified); the next attempt takes them all."""
    svc, v = in_step_setup(n_groups=5)
    coord = svc.coordinator

    async def main() -> None:
        ga, gb = await prove(svc, v, "A", "B")
        g1, _ = await generate_and_push(svc, "A")
        g2, _ = await generate_and_push(svc, "B")
        svc.checks.reserve([g1, g2])
        deferred, checks, failed = run_step_checks(svc, [ga, gb, g1, g2], {g1: "made up"})
        assert failed == {g1: "made up"} and len(deferred) == 2
        assert coord.ledger[ga] == PENDING and coord.ledger[g1] == PENDING  # A's: to other nodes
        assert coord.ledger[gb] == COMPLETED and coord.ledger[g2] == COMPLETED  # B's: the next attempt's
        assert "A" in svc.admission.untrusted and svc.take_contributions() == {"A": 2, "B": 4}
        assert coord.take_drop_counts() == {"unverified": 2}
        g, _ = await generate_and_push(svc, "B")  # the re-issued groups go to another node
        assert g in (ga, g1) and coord.ledger[g] == HELD

    trio.run(main)


def test_new_peers_and_pushes_of_another_version_are_left_to_the_worker():
    svc, v = in_step_setup(n_groups=3)
    coord = svc.coordinator

    async def main() -> None:
        await join(svc, "N")
        g0, _ = await generate_and_push(svc, "N")  # a new peer: the worker checks it first
        svc.checks.reserve([g0])
        assert not svc.checks.step_ready([g0]) and svc.checks.take_for_step() == []
        (ga,) = await prove(svc, v, "A")
        v.weights_version = 5  # A's next push claims version 0: not what the next step trains from
        g1, _ = await generate_and_push(svc, "A")
        svc.checks.reserve([ga, g1])
        assert not svc.checks.step_ready([ga, g1]) and coord.ledger[g1] == HELD

    trio.run(main)
