"""Holds (verification after the ack): held groups are done for their node but never trained
until released; a revoked or discarded hold puts them back to pending; the ledger stays exact
(every group in one state, trained at most once) over many interleavings."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.buffer import ReplayBuffer
from learner.checkpoint import open_problem_refs
from learner.coordinator import COMPLETED, HELD, LEASED, PENDING, TRAINED, Coordinator, GroupSpec, Limits
from swarm.proto.rollouts import Completion, GroupResult

G = 2


def make(n_groups=4, per_lease=2, buffer=None):
    c = Coordinator(Limits(group_size=G, max_tokens=8, vocab_size=100), lease_timeout_s=10.0,
                    groups_per_lease=per_lease, buffer=buffer)
    c.add_groups([GroupSpec(f"g{i}", [1, 2, 3], str(i)) for i in range(n_groups)])
    return c


def result(gid, version=0):
    return GroupResult(gid, version, [Completion([5, 6], [-0.1, -2.0], "stop") for _ in range(G)])


def push(c, peer, lease):
    acc, rej = c.submit(peer, lease.lease_id, [result(g, lease.version) for g in lease.group_ids], now=1.0)
    assert rej == {}
    return acc


def test_held_groups_are_done_for_the_node_but_not_trainable_until_released():
    c = make()
    lease = c.lease("A", 2, now=0.0)
    acc = push(c, "A", lease)
    hid = c.hold(acc)
    assert all(c.ledger[g] == HELD for g in acc) and c.holding(hid) == acc
    assert lease.lease_id not in c.ledger.leases  # the lease is finished: the node may take new work
    assert c.ready() == 0 and c.completed_ids() == [] and c.in_flight() == 4
    with pytest.raises(ValueError):
        c.take(acc)
    assert sorted(open_problem_refs(c)) == ["0", "1", "2", "3"]  # a checkpoint re-issues them
    assert c.release(hid) == acc and c.holding(hid) == [] and c.held == {}
    assert c.ready() == 2 and [g.spec.group_id for g in c.take(acc)] == acc
    assert all(c.ledger[g] == TRAINED for g in acc)
    assert c.release(hid) == []  # a hold is released once


def test_a_held_group_pushed_again_is_refused_as_already_completed():
    c = make()
    lease = c.lease("A", 2, now=0.0)
    acc, _ = c.submit("A", lease.lease_id, [result(lease.group_ids[0])], now=1.0)  # the lease stays open
    c.hold(acc)
    assert c.submit("A", lease.lease_id, [result(acc[0])], now=2.0) == ([], {acc[0]: "already_completed"})
    assert c.ledger[acc[0]] == HELD


def test_revoking_the_peer_drops_its_held_groups_and_reissues_them_to_others():
    c = make()
    la, lb = c.lease("A", 2, now=0.0), c.lease("B", 2, now=0.0)
    hid = c.hold(push(c, "A", la))
    push(c, "B", lb)
    back = c.revoke_peer("A", "unverified")
    assert sorted(back) == sorted(la.group_ids)
    assert all(c.ledger[g] == PENDING for g in back) and c.holds == {} and c.held == {}
    assert c.holding(hid) == [] and c.release(hid) == []
    assert c.take_drop_counts() == {"unverified": 2} and c.discarded["unverified"] == 2
    assert c.ready() == 2 and sorted(c.completed_ids()) == sorted(lb.group_ids)
    assert c.lease("A", 2, now=2.0) is None  # never back to the peer that failed
    assert sorted(c.lease("C", 2, now=2.0).group_ids) == sorted(back)


def test_a_discarded_hold_goes_back_to_pending_for_anyone():
    c = make(n_groups=2)
    lease = c.lease("A", 2, now=0.0)
    hid = c.hold(push(c, "A", lease))
    assert c.discard_hold(hid, "verify_error") == lease.group_ids
    assert [c.ledger[g] for g in lease.group_ids] == [PENDING, PENDING] and c.completed == {}
    assert c.ledger.pending_order()[:2] == lease.group_ids and c.take_drop_counts() == {"verify_error": 2}
    assert c.lease("A", 2, now=1.0).group_ids == lease.group_ids  # the peer is not blamed


def test_a_later_push_joins_an_outstanding_hold_and_is_released_with_it():
    c = make(per_lease=1)
    c.probation.proven.add("A")  # A delivered before: not on probation, so it may hold two leases
    l1, l2 = c.lease("A", 1, now=0.0), c.lease("A", 1, now=0.0)
    hid = c.hold(push(c, "A", l1))
    assert c.hold(push(c, "A", l2), into=hid) == hid
    assert c.holding(hid) == l1.group_ids + l2.group_ids
    assert c.release(hid) == l1.group_ids + l2.group_ids and c.ready() == 2
    l3 = c.lease("A", 1, now=0.0)
    assert c.hold(push(c, "A", l3), into=hid) != hid  # a released hold is not joined again


def test_async_held_groups_stay_buffered_skip_batches_and_expire():
    c = make(n_groups=4, buffer=ReplayBuffer(max_staleness=0, capacity=8))
    la, lb = c.lease("A", 2, now=0.0), c.lease("B", 2, now=0.0)
    hid = c.hold(push(c, "A", la))
    push(c, "B", lb)
    assert c.ready() == 2 and len(c.completed) == 4
    assert sorted(g.spec.group_id for g in c.take_batch(4)) == sorted(lb.group_ids)  # held ones left
    assert all(c.ledger[g] == HELD for g in la.group_ids)
    c.set_version(1)  # staleness 0: the held groups expire like any other
    assert all(c.ledger.label(g) == "dropped:stale" for g in la.group_ids)
    assert c.holds == {} and c.held == {} and c.release(hid) == []


def test_an_evicted_held_group_leaves_its_hold():
    c = make(n_groups=3, per_lease=1, buffer=ReplayBuffer(max_staleness=2, capacity=2))
    l0 = c.lease("A", 1, now=0.0)
    hid = c.hold(push(c, "A", l0))
    c.set_version(1)
    for peer in ("B", "C"):
        push(c, peer, c.lease(peer, 1, now=0.0))  # v1 groups: the v0 held one is evicted
    assert c.ledger.label(l0.group_ids[0]) == "dropped:evicted" and c.holding(hid) == [] and c.held == {}


def check_ledger(c: Coordinator, trained: list[str]) -> None:
    """Every group in one state; held <-> in a hold <-> kept; nothing trained twice."""
    held_in_holds = [g for gids in c.holds.values() for g in gids]
    assert sorted(held_in_holds) == sorted(c.held) == sorted(g for g, s in c.ledger.items() if s == HELD)
    assert all(c.held[g] == h for h, gids in c.holds.items() for g in gids) and all(c.holds.values())
    for gid, state in c.ledger.items():
        assert state in (PENDING, LEASED, HELD, COMPLETED, TRAINED) or c.ledger.label(gid).startswith("dropped:")
        assert (gid in c.completed) == (state in (HELD, COMPLETED))
    assert len(trained) == len(set(trained))
    assert sorted(trained) == sorted(g for g, s in c.ledger.items() if s == TRAINED)


ACTIONS = st.lists(st.tuples(st.sampled_from(["lease", "push", "push_held", "release", "revoke", "discard",
                                              "train", "late"]),
                             st.integers(0, 7)), min_size=10, max_size=60)


@settings(max_examples=150, deadline=None)
@given(actions=ACTIONS, use_buffer=st.booleans())
def test_interleavings_never_train_a_held_group_and_lose_nothing(actions, use_buffer):
    """Nodes lease and push (held or not), holds are released, revoked or discarded, batches are
    trained and versions advance, in any order: a held group is never trained, every group is
    in exactly one state after every action, and none is trained twice."""
    buffer = ReplayBuffer(max_staleness=1, capacity=6) if use_buffer else None
    c = make(n_groups=12, per_lease=2, buffer=buffer)
    leases, trained, now = [], [], 0.0
    for kind, a in actions:
        peer = f"p{a % 3}"
        if kind == "lease":
            rec = c.lease(peer, 2, now)
            if rec is not None:
                leases.append(rec)
        elif kind in ("push", "push_held") and leases:
            rec = leases.pop(a % len(leases))
            acc, _ = c.submit(rec.peer_id, rec.lease_id, [result(g, rec.version) for g in rec.group_ids], now)
            if kind == "push_held":
                mine = [h for h, gids in c.holds.items() if c.completed[gids[0]].peer_id == rec.peer_id]
                c.hold(acc, into=mine[-1] if mine and a % 2 else None)
        elif kind == "release" and c.holds:
            c.release(list(c.holds)[a % len(c.holds)])
        elif kind == "discard" and c.holds:
            c.discard_hold(list(c.holds)[a % len(c.holds)], "verify_error")
        elif kind == "revoke":
            c.revoke_peer(peer, "unverified")
            leases = [r for r in leases if r.peer_id != peer]
        elif kind == "late":
            now += 11.0
            c.expire(now)
        elif kind == "train":
            held_before = set(c.held)
            if buffer is not None:
                batch = c.take_batch(2)
                c.set_version(c.version + 1)
            else:
                batch = c.take(c.completed_ids()[:2])
            got = [g.spec.group_id for g in batch]
            assert not held_before & set(got), "a held group was trained"
            trained += got
        check_ledger(c, trained)


def test_a_held_push_takes_its_peer_off_probation_only_when_its_check_passes():
    c = make(n_groups=4, per_lease=1)
    fresh, honest = c.lease("fresh", 1, now=0.0), c.lease("honest", 1, now=0.0)
    made_up = c.submit("fresh", fresh.lease_id, [result(fresh.group_ids[0])], now=1.0, proven=False)[0]
    good = c.submit("honest", honest.lease_id, [result(honest.group_ids[0])], now=2.0, proven=False)[0]
    bad_hold, good_hold = c.hold(made_up), c.hold(good)
    # accepted into a hold is not proven: both are still on probation (one lease each, backed up)
    assert c.probation.on_probation("fresh") and c.probation.on_probation("honest")
    assert c.release(good_hold) == good and not c.probation.on_probation("honest")
    c.discard_hold(bad_hold, "unverified", not_to="fresh")  # its check failed
    assert c.probation.on_probation("fresh") and c.probation.unchecked == {}
    c.lease("fresh", 1, now=3.0)
    assert c.lease("fresh", 1, now=3.0) is None  # still one lease at a time
