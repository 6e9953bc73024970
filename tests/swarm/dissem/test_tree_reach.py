"""Broadcast plans with measured reachability: an unreachable node is never a relay, is fed
by the learner in every stripe, and the reachable nodes still form the usual tree."""

from __future__ import annotations

import random

import pytest

from swarm.dissem.tree import Member, build_plan, walk


def learner_children(plan, stripe):
    return {r.peer_id for r in plan.roots[stripe]}


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("k,stripes", [(2, 0), (2, 1), (3, 0), (4, 2)])
def test_unreachable_nodes_are_learner_fed_leaves(seed, k, stripes):
    rng = random.Random(seed)
    n = rng.randint(1, 40)
    ms = [Member(f"p{i:03d}", rng.choice([0.0, 1e6, 5e6, 2e7]), reachable=rng.random() < 0.6) for i in range(n)]
    plan = build_plan(ms, "tree", k, stripes)
    unreachable = {m.peer_id for m in ms if not m.reachable}
    assert not (plan.relays() & unreachable)
    for s in range(plan.stripes):
        seen = [node.peer_id for root in plan.roots[s] for node in walk(root)]
        assert sorted(seen) == sorted(m.peer_id for m in ms)  # everyone exactly once per stripe
        assert unreachable <= learner_children(plan, s)
        assert all(len(node.children) <= k for root in plan.roots[s] for node in walk(root))


def test_reachable_nodes_keep_their_tree():
    ms = [Member(f"p{i:03d}", float(i)) for i in range(10)]
    with_nat = ms + [Member("zzz", 1e9, reachable=False)]
    a, b = build_plan(ms, "tree", 2), build_plan(with_nat, "tree", 2)
    for s in range(a.stripes):
        assert [r.peer_id for r in b.roots[s]][:-1] == [r.peer_id for r in a.roots[s]]
        assert b.roots[s][-1].peer_id == "zzz" and not b.roots[s][-1].children
    # the fastest node, unreachable, relays nothing
    assert "zzz" not in b.relays() and b.relays() == a.relays()


def test_all_unreachable_is_a_star_per_stripe():
    ms = [Member(f"p{i}", reachable=False) for i in range(5)]
    plan = build_plan(ms, "tree", 2)
    assert plan.relays() == set() and plan.depth() == 1
    assert plan.uploads()[""] == pytest.approx(5.0)


def test_star_mode_ignores_reachability():
    ms = [Member("a"), Member("b", reachable=False)]
    plan = build_plan(ms, "star")
    assert learner_children(plan, 0) == {"a", "b"} and plan.relays() == set()
