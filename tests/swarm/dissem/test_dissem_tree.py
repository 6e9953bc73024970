"""Broadcast plans: fan-out, bandwidth order, striping, star, rebuilds."""

from __future__ import annotations

import pytest

from swarm.dissem.tree import Member, build_plan, walk


def members(n: int, bw=None) -> list[Member]:
    return [Member(f"p{i:03d}", (bw or (lambda i: 0.0))(i)) for i in range(n)]


def parents(plan, stripe: int) -> dict[str, str]:
    out = {}
    for root in plan.roots[stripe]:
        out[root.peer_id] = ""
        for node in walk(root):
            for c in node.children:
                out[c.peer_id] = node.peer_id
    return out


@pytest.mark.parametrize("n,k,stripes", [(1, 2, 0), (2, 2, 0), (16, 2, 0), (16, 2, 1), (17, 3, 0), (100, 4, 2)])
def test_every_node_once_per_stripe_and_fan_out_respected(n, k, stripes):
    plan = build_plan(members(n), "tree", k, stripes)
    for s in range(plan.stripes):
        seen = [node.peer_id for root in plan.roots[s] for node in walk(root)]
        assert sorted(seen) == sorted(m.peer_id for m in members(n))
        assert all(len(node.children) <= k for root in plan.roots[s] for node in walk(root))


def test_striped_tree_balances_upload_and_stays_shallow():
    plan = build_plan(members(16), "tree", fan_out=2)
    assert plan.stripes == 2
    up = plan.uploads()
    assert up[""] == pytest.approx(1.0)  # the learner sends one copy in all
    assert max(v for p, v in up.items() if p) <= 1.0 + 1e-9  # no node uploads more than one copy
    assert plan.depth() <= 5
    single = build_plan(members(16), "tree", fan_out=2, stripes=1)
    assert max(single.uploads().values()) == pytest.approx(2.0)


def test_faster_nodes_sit_nearer_the_root():
    bw = lambda i: float(i)  # p015 is fastest
    plan = build_plan(members(15, bw), "tree", fan_out=2, stripes=1)
    par = parents(plan, 0)

    def depth(p):
        d = 0
        while par[p]:
            p, d = par[p], d + 1
        return d
    assert [r.peer_id for r in plan.roots[0]] == ["p014", "p013"]  # the learner feeds fan_out roots
    assert [c.peer_id for c in plan.roots[0][0].children] == ["p012", "p011"]
    speeds = sorted(((depth(m.peer_id), m.upload_bps) for m in members(15, bw)))
    for (d1, b1), (d2, b2) in zip(speeds, speeds[1:]):
        assert d1 == d2 or b1 > b2


def test_star_and_rebuild_on_membership_change():
    star = build_plan(members(5), "star")
    assert star.depth() == 1 and len(star.roots[0]) == 5 and star.uploads()[""] == 5
    a = build_plan(members(6), "tree", 2)
    b = build_plan(members(7), "tree", 2)
    assert a.nodes() != b.nodes() and "p006" in b.nodes()
    assert build_plan(members(6), "tree", 2) == a  # deterministic


def test_bad_settings_rejected():
    with pytest.raises(ValueError):
        build_plan(members(3), "mesh")
    with pytest.raises(ValueError):
        build_plan(members(3), "tree", fan_out=0)
    with pytest.raises(ValueError):
        build_plan(members(2) + members(1), "tree")
