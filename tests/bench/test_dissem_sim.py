"""The event-driven simulator against closed forms, and at N = 10,000."""

from __future__ import annotations

import pytest

from bench.dissem_sim import chunk_sizes, simulate
from swarm.dissem.tree import Member, Plan, build_plan, heap_tree, walk

W = 12.5e6  # 100 Mbit/s
M = 4_000_000
CHUNK = 250_000


def members(n):
    return [Member(f"p{i:05d}") for i in range(n)]


@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_star_is_n_copies_through_the_learner_link(n):
    r = simulate(build_plan(members(n), "star"), M, CHUNK, W)
    assert r.makespan == pytest.approx(n * M / W)
    assert r.sent[""] == n * M


@pytest.mark.parametrize("n", [1, 3, 8])
def test_chain_pipelines_one_chunk_per_hop(n):
    plan = build_plan(members(n), "tree", fan_out=1, stripes=1)
    assert plan.depth() == n
    r = simulate(plan, M, CHUNK, W)
    assert r.makespan == pytest.approx(M / W + (n - 1) * CHUNK / W)


def test_striped_tree_near_floor_and_star_linear():
    for n in (4, 16, 64, 300):
        plan = build_plan(members(n), "tree", 2)
        r = simulate(plan, M, CHUNK, W)
        # The floor plus a start-up of one chunk per hop per child of the relay.
        assert M / W <= r.makespan <= M / W + plan.depth() * 2 * CHUNK / W
        assert max(r.sent.values()) <= M  # nobody uploads more than one copy
    assert simulate(build_plan(members(16), "tree", 2), M, CHUNK, W).makespan <= 1.5 * M / W
    plain = simulate(build_plan(members(16), "tree", 2, stripes=1), M, CHUNK, W).makespan
    assert plain == pytest.approx(2 * M / W, rel=0.2)  # a relay of a plain binary tree sends 2 copies


def test_hop_latency_and_slow_downloads():
    plan = build_plan(members(1), "tree", 1, 1)
    assert simulate(plan, M, CHUNK, W, hop_latency_s=0.25).makespan == pytest.approx(0.25 + M / W)
    assert simulate(plan, M, CHUNK, W, down_bps=W / 4).makespan == pytest.approx(4 * M / W)


def test_heterogeneous_upload_fast_nodes_relay():
    # 12 nodes, binary tree: 5 relays. Six nodes are fast, six have a tenth of the upload.
    ms = [Member(f"p{i:02d}", W if i < 6 else W / 10) for i in range(12)]
    up = {m.peer_id: m.upload_bps for m in ms}
    fast_first = build_plan(ms, "tree", 2, stripes=1)
    assert all(up[n.peer_id] == W for r in fast_first.roots[0] for n in walk(r) if n.children)
    slow_first = Plan("tree", 1, [heap_tree([m.peer_id for m in reversed(ms)], 2, 2)])
    t_fast = simulate(fast_first, M, CHUNK, up, learner_up_bps=2 * W).makespan
    t_slow = simulate(slow_first, M, CHUNK, up, learner_up_bps=2 * W).makespan
    assert t_fast == pytest.approx(2 * M / W, rel=0.2) and t_slow > 5 * t_fast


def test_ten_thousand_nodes():
    plan = build_plan(members(10_000), "tree", 4)
    r = simulate(plan, 1_000_000, CHUNK, W)
    assert len(r.done) == 10_000 and all(t < float("inf") for t in r.done.values())
    assert r.makespan < 1.5 * 1_000_000 / W + plan.depth() * 4 * CHUNK / W


def test_chunk_sizes():
    assert chunk_sizes(10, 4) == [4, 4, 2] and chunk_sizes(0, 4) == [0] and sum(chunk_sizes(M, CHUNK)) == M
