"""Broadcast plans over links: every parent can reach its child over a connection one of them
can open, NAT'd nodes that punched holes relay, nodes with no way in are leaves under dialable
parents, and with every link present the plan is the plain heap tree."""

from __future__ import annotations

import random

import pytest

from swarm.discovery.links import LEARNER, PUNCH, REVERSED, Links, links_from, relay_role
from swarm.dissem.tree import Member, build_plan, link_dials, walk


def edges(plan):
    for s, trees in enumerate(plan.roots):
        stack = [(LEARNER, t) for t in trees]
        while stack:
            parent, node = stack.pop()
            yield s, parent, node.peer_id
            stack.extend((node.peer_id, c) for c in node.children)


def shape(plan):
    return [[(n.peer_id, [c.peer_id for c in n.children]) for t in trees for n in walk(t)] for trees in plan.roots]


@pytest.mark.parametrize("k,stripes", [(2, 0), (2, 1), (3, 0), (4, 2)])
def test_every_link_present_gives_the_heap_tree(k, stripes):
    ms = [Member(f"p{i:03d}", float(i % 5)) for i in range(37)]
    everyone = Links(dialable=frozenset(m.peer_id for m in ms))
    assert shape(build_plan(ms, "tree", k, stripes, links=everyone)) == shape(build_plan(ms, "tree", k, stripes))


def random_links(rng, peers):
    dialable = {p for p in peers if rng.random() < 0.3}
    nat = [p for p in peers if p not in dialable]
    results = [(a, b, rng.random() < 0.5, "timeout") for i, a in enumerate(nat) for b in nat[i + 1:]
               if rng.random() < 0.4]
    return links_from(dialable, results)


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("k,stripes", [(2, 0), (2, 1), (3, 0)])
def test_every_edge_is_a_link_and_every_node_is_placed(seed, k, stripes):
    rng = random.Random(seed)
    ms = [Member(f"p{i:03d}", rng.choice([0.0, 1e6, 4e6])) for i in range(rng.randint(1, 40))]
    links = random_links(rng, [m.peer_id for m in ms])
    plan = build_plan(ms, "tree", k, stripes, links=links)
    leaves = {m.peer_id for m in ms if not relay_role(links, m.peer_id).relay}
    assert not plan.relays() & leaves
    for s in range(plan.stripes):
        seen = [n.peer_id for t in plan.roots[s] for n in walk(t)]
        assert sorted(seen) == sorted(m.peer_id for m in ms)
    for _s, parent, child in edges(plan):
        assert links.can_link(parent, child), (parent, child)
        if parent != LEARNER:
            assert len([1 for s2, p2, _c in edges(plan) if p2 == parent and s2 == _s]) <= k


def test_nat_nodes_that_punched_relay_and_symmetric_ones_are_leaves_under_dialable_parents():
    # 2 public nodes, 4 behind punchable routers (they punched with each other), 2 behind a
    # symmetric router (every punch failed) -- the integration test's swarm
    pub, punch, sym = ["a0", "a1"], ["e0", "e1", "e2", "e3"], ["s0", "s1"]
    results = [(x, y, True, "") for i, x in enumerate(punch) for y in punch[i + 1:]]
    results += [(x, y, False, "no answer") for x in sym for y in punch + sym if x != y]
    links = links_from(pub, results, {p: "no answer from 10.78.0.2" for p in punch + sym})
    ms = [Member(p) for p in pub + punch + sym]
    plan = build_plan(ms, "tree", 2, links=links)
    assert set(punch) <= plan.relays()
    assert not plan.relays() & set(sym)
    for _s, parent, child in edges(plan):
        if child in sym:
            assert parent == LEARNER or parent in pub
    role = relay_role(links, "s0")
    assert role.kind == "leaf" and "symmetric" in role.why and "hole punch failed" in role.why
    assert relay_role(links, "e0").kind == "punched" and relay_role(links, "a0").kind == "dialable"
    # the learner feeds fewer copies than with NAT'd nodes as learner-fed leaves
    old = build_plan([Member(p, reachable=p in pub) for p in pub + punch + sym], "tree", 2)
    assert plan.uploads()[""] < old.uploads()[""]


def test_link_dials_name_who_must_dial():
    links = links_from(["pub"], [("n1", "n2", True, "")])
    assert links.dial("pub", "n1").how == REVERSED and links.dial("pub", "n1").dialer == "n1"
    assert links.dial("n1", "pub").needs_instruction is False
    assert links.dial("n1", "n2").how == PUNCH
    assert links.dial("n1", "n3") is None and links.dial(LEARNER, "n3").needs_instruction is False
    ms = [Member("pub", 3.0), Member("n1", 2.0), Member("n2", 1.0)]
    plan = build_plan(ms, "tree", 1, 1, links=links)  # a chain: pub -> n1 -> n2
    assert [(n.peer_id) for n in walk(plan.roots[0][0])] == ["pub", "n1", "n2"]
    dials = link_dials(plan, links)
    assert [(d.dialer, d.listener, d.how) for d in dials] == [("n1", "pub", REVERSED), ("n2", "n1", PUNCH)]


def test_a_node_nobody_links_with_is_fed_by_the_learner():
    # n2 is NAT'd and linked with nobody but the learner; n1 punched with no one either
    links = links_from([], [("n1", "n2", False, "timeout")])
    plan = build_plan([Member("n1"), Member("n2")], "tree", 2, links=links)
    for s in range(plan.stripes):
        assert {t.peer_id for t in plan.roots[s]} == {"n1", "n2"}


def test_latest_punch_result_wins():
    links = links_from([], [("a", "b", True, ""), ("b", "a", False, "reset")])
    assert not links.can_link("a", "b") and links.failed_with("a") == ["b"]
    links = links_from([], [("a", "b", False, "reset"), ("a", "b", True, "")])
    assert links.can_link("a", "b") and links.punched_with("b") == ["a"]


def test_links_inside_one_network_carry_data_but_do_not_make_a_relay():
    # s0, s1 behind one symmetric router: they reach each other over their LAN, every punch
    # through the router failed; e0 punched with e1 across two routers
    links = links_from(["pub"], [("s0", "e0", False, "timeout"), ("e0", "e1", True, "")], lan=[("s0", "s1")])
    assert links.can_link("s0", "s1") and links.dial("s0", "s1").how == REVERSED
    role = relay_role(links, "s0")
    assert not role.relay and "inside its own network (1 peer(s))" in role.why and "symmetric" in role.why
    assert relay_role(links, "e0").relay and relay_role(links, "e0").kind == "punched"
    plan = build_plan([Member(p) for p in ("pub", "e0", "e1", "s0", "s1")], "tree", 2, links=links)
    assert not {"s0", "s1"} & plan.relays()


def test_leaves_fill_the_interior_nodes_slots_before_any_node_relays_in_a_second_tree():
    # n0 dialable, n1 punched with n2 and n3. Taking each tree's leaves in turn into the first
    # free slot they can link with left n1 with no linkable slot in the first tree, and a node
    # that relays in the other tree took it (1.5 copies up); matched over the links, every node
    # uploads at most one copy and the learner one
    links = links_from(["n0"], [("n1", "n2", True, ""), ("n1", "n3", True, "")])
    plan = build_plan([Member(f"n{i}") for i in range(4)], "tree", 2, links=links)
    assert max(plan.uploads().values()) == 1.0
    relays = [{n.peer_id for t in trees for n in walk(t) if n.children} for trees in plan.roots]
    assert not relays[0] & relays[1], relays
    assert all(links.can_link(p, c) for _s, p, c in edges(plan))



@pytest.mark.parametrize("seed", range(10))
def test_can_link_says_whether_dial_finds_a_way(seed):
    rng = random.Random(seed)
    peers = [f"p{i}" for i in range(12)]
    links = random_links(rng, peers)
    links = links_from(links.dialable, [(*sorted(p), True, "") for p in links.punched],
                       lan=[tuple(sorted((a, b))) for a, b in zip(peers[::2], peers[1::2]) if rng.random() < 0.3])
    for a in peers + [LEARNER]:
        for b in peers + [LEARNER]:
            assert links.can_link(a, b) == (links.dial(a, b) is not None), (a, b)
