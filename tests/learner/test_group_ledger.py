"""The group ledger: its transition table is the only way a group moves, and its indexes (counts,
leases per peer, the pending queue) always agree with a recount."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.group_ledger import TRANSITIONS, GroupEvent, GroupLedger, GroupState, IllegalTransition

S, E = GroupState, GroupEvent


def ledger_in(state: GroupState) -> GroupLedger:
    """A ledger holding group ``g`` in ``state``, reached through legal moves only."""
    led = GroupLedger()
    led.add("g")
    path = {S.PENDING: [], S.LEASED: [E.LEASE], S.COMPLETED: [E.LEASE, E.ACCEPT],
            S.HELD: [E.LEASE, E.ACCEPT, E.HOLD], S.TRAINED: [E.LEASE, E.ACCEPT, E.TRAIN],
            S.DROPPED: [E.DROP]}[state]
    for event in path:
        led.apply("g", event, "stale")
    assert led["g"] is state
    return led


@pytest.mark.parametrize("state", list(GroupState))
@pytest.mark.parametrize("event", list(GroupEvent))
def test_only_the_table_moves_a_group(state, event):
    led = ledger_in(state)
    before = (led.counts(), led.pending_order())
    if (state, event) in TRANSITIONS:
        assert led.apply("g", event, "why") is TRANSITIONS[(state, event)]
        assert led["g"] is TRANSITIONS[(state, event)]
    else:
        with pytest.raises(IllegalTransition, match=f"from {state}"):
            led.apply("g", event)
        assert led["g"] is state and (led.counts(), led.pending_order()) == before  # nothing changed


def test_dropped_is_final_and_keeps_its_reason():
    led = ledger_in(S.DROPPED)
    assert led.label("g") == "dropped:stale" and led.counts() == {"dropped:stale": 1}
    assert not any(s is S.DROPPED for s, _ in TRANSITIONS)
    with pytest.raises(ValueError, match="already added"):
        led.add("g")


def test_requeued_groups_go_first_and_refused_ones_keep_their_place():
    led = GroupLedger()
    for g in ("a", "b", "c", "d"):
        led.add(g)
    lease = led.open_lease("L0", "p", led.take_pending(2, lambda g: False), 0, 0.0, 10.0)
    assert lease.group_ids == ["a", "b"] and led.pending_order() == ["c", "d"]
    led.apply("b", E.REQUEUE)
    led.apply("a", E.REQUEUE)
    assert led.pending_order() == ["a", "b", "c", "d"]
    assert led.take_pending(2, lambda g: g == "a") == ["b", "c"]
    assert led.pending_order() == ["a", "d"]  # a kept its place; b, c are the caller's to lease


def test_a_group_queued_twice_is_taken_once():
    led = GroupLedger()
    led.add("a")
    led.apply("a", E.ACCEPT)  # a late result while pending: its queue entry is stale
    led.apply("a", E.DISCARD)  # pending again: a second entry at the front
    assert led.take_pending(5, lambda g: False) == ["a"]


def test_leases_are_indexed_per_peer():
    led = GroupLedger(max_expired=1)
    for g in ("a", "b", "c"):
        led.add(g)
    l0 = led.open_lease("L0", "p", ["a"], 3, 0.0, 5.0)
    led.open_lease("L1", "p", ["b"], 4, 0.0, 9.0)
    led.open_lease("L2", "q", ["c"], 4, 0.0, 9.0)
    assert led.leases_held("p") == 2 and led.busy_peers() == {"p", "q"} and led.next_deadline() == 5.0
    stats = led.statistics()
    assert stats.peers["p"].open_groups == 2 and stats.peers["p"].newest_version == 4 and stats.active_leases == 3
    assert led.due(5.0) == ["L0"]
    led.end_lease("L0", expired=True)
    assert led.known_lease("L0") is l0 and "L0" not in led.leases and led.leases_held("p") == 1
    assert led.busy_peers(now=6.0, recent_s=2.0) == {"p", "q"} and led.busy_peers(now=8.0, recent_s=2.0) == {"p", "q"}
    led.apply("b", E.ACCEPT)
    led.close_group(led.leases["L1"], "b")  # its last open group: the lease is closed
    assert led.leases_held("p") == 0 and led.busy_peers() == {"q"}
    led.end_lease("L2", expired=True)  # only one expired lease is remembered
    assert led.known_lease("L0") is None and led.known_lease("L2") is not None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(list(GroupEvent))), max_size=60))
def test_counts_agree_with_a_recount(moves):
    led = GroupLedger()
    for i in range(6):
        led.add(f"g{i}")
    for i, event in moves:
        try:
            led.apply(f"g{i}", event, "r")
        except IllegalTransition:
            pass
    recount: dict[str, int] = {}
    for gid in led:
        label = led.label(gid)
        assert label is not None
        recount[label] = recount.get(label, 0) + 1
    assert led.counts() == recount
    assert led.in_flight() == sum(led[g] in (S.PENDING, S.LEASED, S.HELD, S.COMPLETED) for g in led)
    assert sorted(led.pending_order()) == sorted(g for g in led if led[g] is S.PENDING)
