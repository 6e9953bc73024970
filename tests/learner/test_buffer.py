"""Replay buffer and async coordination: the staleness bound, capacity, and that every group is
trained at most once and otherwise accounted for, over many interleavings (hypothesis)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.buffer import EVICTED, STALE, ReplayBuffer, admissible, staleness
from learner.coordinator import COMPLETED, LEASED, PENDING, TRAINED, Coordinator, GroupSpec, Limits
from swarm.proto.rollouts import Completion, GroupResult

G = 2


@dataclass
class _Group:
    result: GroupResult


def group(version: int) -> _Group:
    return _Group(GroupResult("x", version, []))


def test_admissible_window():
    assert staleness(5, 3) == 2
    assert admissible(5, 5, 0) and not admissible(5, 4, 0)
    assert admissible(5, 3, 2) and not admissible(5, 2, 2)
    assert not admissible(5, 6, 3)  # a version from the future is never admissible


def test_buffer_refuses_stale_expires_and_takes_oldest_first():
    b = ReplayBuffer(max_staleness=1, capacity=10)
    assert b.add("old", group(3), current_version=5) == {"old": STALE}
    assert b.add("a", group(5), 5) == {} and b.add("b", group(4), 5) == {} and b.add("c", group(5), 5) == {}
    assert b.ready(5) == 3
    taken, dropped = b.take(2, current_version=5)
    assert [g for g, _ in taken] == ["b", "a"] and dropped == {}
    assert b.add("d", group(4), 5) == {}
    assert b.expire(6) == {"d": STALE} and list(b.groups) == ["c"]  # v5 at u=6 is still fine
    taken, dropped = b.take(5, current_version=7)
    assert taken == [] and dropped == {"c": STALE} and len(b) == 0


def test_buffer_evicts_the_oldest_version_when_full():
    b = ReplayBuffer(max_staleness=3, capacity=2)
    b.add("a", group(4), 5)
    b.add("b", group(3), 5)
    assert b.add("c", group(5), 5) == {"b": EVICTED}
    assert b.add("d", group(2), 5) == {"d": EVICTED}  # the newcomer itself is the oldest
    assert sorted(b.groups) == ["a", "c"]
    with pytest.raises(ValueError):
        ReplayBuffer(max_staleness=-1, capacity=2)


def _result(gid: str, version: int) -> GroupResult:
    return GroupResult(gid, version, [Completion([5, 6], [-0.1, -2.0], "stop") for _ in range(G)])


ACTIONS = st.lists(st.tuples(st.sampled_from(["add", "lease", "push", "push", "push", "late", "die", "train"]),
                             st.integers(0, 7), st.integers(0, 7)), min_size=20, max_size=80)


@settings(max_examples=100, deadline=None)
@given(s=st.integers(0, 3), capacity=st.integers(2, 6), actions=ACTIONS)
def test_async_interleavings_keep_the_bound_and_lose_nothing(s, capacity, actions):
    """Fake nodes lease, push (on time, late, partially, or with a forged version), die and
    rejoin while the learner trains batches of 2 and publishes versions, in any order: no
    trained rollout exceeds S, no group is trained twice, every group has a recorded state."""
    coord = Coordinator(Limits(group_size=G, max_tokens=8, vocab_size=100), lease_timeout_s=10.0,
                        groups_per_lease=2, buffer=ReplayBuffer(s, capacity))
    now, added, held, trained = 0.0, 0, [], []
    for kind, a, b in actions:
        if kind == "add":
            coord.add_groups([GroupSpec(f"g{added + i}", [1, 2], str(added + i)) for i in range(a % 3 + 1)])
            added += a % 3 + 1
        elif kind == "lease":
            rec = coord.lease(f"p{a % 3}", b % 2 + 1, now)
            if rec is not None:
                assert rec.version == coord.version  # new work never starts under an old adapter
                held.append(rec)
        elif kind == "push" and held:
            rec = held.pop(a % len(held))
            gids = rec.group_ids[:1] if b == 1 else rec.group_ids
            forged = b == 7
            accepted, _ = coord.submit(rec.peer_id, rec.lease_id,
                                       [_result(g, rec.version + forged) for g in gids], now)
            assert not (forged and accepted)
        elif kind == "late":
            now += 1.0 + 2.0 * a
            coord.expire(now)
        elif kind == "die":
            held = [r for r in held if r.peer_id != f"p{a % 3}"]
            coord.release_peer(f"p{a % 3}")
        elif kind == "train":
            u = coord.version
            for g in coord.take_batch(2):
                assert 0 <= u - g.result.version <= s, "a trained rollout exceeds the staleness bound"
                assert g.spec.group_id not in trained, "a group was trained twice"
                trained.append(g.spec.group_id)
            coord.set_version(u + 1)
        # every group is accounted for, after every action
        assert len(coord.ledger) == added
        for gid, state in coord.ledger.items():
            assert coord.ledger.label(gid) in (PENDING, LEASED, COMPLETED, TRAINED, "dropped:stale", "dropped:evicted")
            assert (gid in coord.completed) == (state == COMPLETED)
        assert sorted(trained) == sorted(g for g, st_ in coord.ledger.items() if st_ == TRAINED)
        assert len(coord.completed) <= capacity
        assert all(0 <= coord.version - g.result.version <= s for g in coord.completed.values())
