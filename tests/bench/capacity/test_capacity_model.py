"""The analytical model's limiting cases, worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.capacity.model import INF, Network, WorkerClass, Workload, evaluate, fifo_steady_state, node_delays

ONE = [WorkerClass("w", group_s=10.0)]


def test_one_worker_large_staleness_is_supply_bound():
    # g=8 groups of 10 s from one node: P = g L = 80 s, U = 20 / 80
    p = evaluate(Workload(8, 8, train_s=20.0, staleness=4), ONE, [1])
    assert p.step_s == pytest.approx(80.0, rel=1e-5)
    assert p.utilisation == pytest.approx(0.25, rel=1e-5)
    assert p.samples_per_s == pytest.approx(64 / 80, rel=1e-5)
    # a group started s seconds after publication (s uniform in [0, 80)) arrives at s + 10 and is
    # trained at the next step start, 60 s after publication: lag 0 iff s < 50
    assert p.staleness[:2] == pytest.approx([50 / 80, 30 / 80], abs=1e-5)
    assert p.wasted == 0.0


def test_one_worker_staleness_zero_async_loses_the_group_in_flight():
    # S=0: only groups started after the publication count: P = T + (g + 1) L
    p = evaluate(Workload(8, 8, train_s=20.0, staleness=0), ONE, [1])
    assert p.step_s == pytest.approx(20 + 9 * 10, rel=1e-5)
    assert p.staleness == [1.0]


def test_sequential_is_generate_then_train():
    w = Workload(8, 8, train_s=20.0, mode="sequential")
    assert evaluate(w, ONE, [1]).step_s == pytest.approx(20 + 8 * 10)
    assert evaluate(w, ONE, [3]).step_s == pytest.approx(20 + 3 * 10)  # ceil(8 / 3) rounds
    assert evaluate(w, ONE, [8]).utilisation == pytest.approx(20 / 30)


def test_enough_workers_keep_the_learner_busy_and_fifo_saturates_at_s():
    w = Workload(8, 8, train_s=20.0, staleness=2)
    p = evaluate(w, ONE, [8])  # R = 0.8 groups/s, needs 0.4
    assert p.utilisation == 1.0 and p.step_s == 20.0
    assert p.samples_per_s == pytest.approx(64 / 20)
    assert p.staleness == [0.0, 0.0, 1.0]
    assert p.wasted == pytest.approx(1 - 8 / 16)
    assert p.capacity_ratio == pytest.approx(2.0)


def test_exactly_enough_workers_drain_the_buffer():
    # 4 nodes: 8 groups per 20 s; a group started s in [0, 20) after publication arrives at s + 10
    p = evaluate(Workload(8, 8, train_s=20.0, staleness=3), ONE, [4])
    assert p.utilisation == pytest.approx(1.0)
    assert p.staleness == pytest.approx([0.0, 0.5, 0.5, 0.0])


def test_utilisation_matches_echo2_capacity_formula_with_loose_bound():
    w = Workload(16, 4, train_s=30.0, staleness=8)
    for n in (1, 2, 3, 5, 8):
        R = n / 10.0
        assert evaluate(w, ONE, [n]).utilisation == pytest.approx(min(1.0, R * 30.0 / 16), rel=1e-4)


def test_infinite_bandwidth_means_no_dissemination_delay():
    net = Network(adapter_bytes=50e6, learner_up_Bps=INF)
    assert np.all(node_delays(np.full(100, INF), np.full(100, INF), net) == 0)
    w = Workload(8, 8, train_s=20.0, staleness=1)
    cls = [WorkerClass("w", 10.0, down_Bps=INF, up_Bps=INF)]
    assert evaluate(w, cls, [3], net).step_s == pytest.approx(evaluate(w, cls, [3], Network()).step_s)


def test_tree_and_star_delays_by_hand():
    M, chunk = 40e6, 1e6
    down, up = np.full(7, 10e6), np.full(7, 4e6)
    star = node_delays(down, up, Network(adapter_bytes=M, topology="star", learner_up_Bps=14e6))
    assert star == pytest.approx(np.full(7, M / 2e6))  # 14 MB/s shared by 7
    tree = node_delays(down, up, Network(adapter_bytes=M, topology="tree", fanout=2, chunk_bytes=chunk, learner_up_Bps=14e6))
    b1, b2 = min(7e6, 10e6), min(2e6, 10e6)  # learner -> level 1, relay -> children
    lvl1 = M / b1
    lvl2 = chunk / b1 + chunk / b2 + (M - chunk) / b2
    lvl3 = chunk / b1 + 2 * chunk / b2 + (M - chunk) / b2
    assert sorted(tree) == pytest.approx(sorted([lvl1] * 2 + [lvl2] * 4 + [lvl3]))


def test_slow_dissemination_idles_nodes_beyond_the_bound():
    w = Workload(8, 8, train_s=20.0, staleness=1)
    cls = [WorkerClass("w", 10.0, down_Bps=1e6)]
    p = evaluate(w, cls, [40], Network(adapter_bytes=45e6, topology="star", learner_up_Bps=INF))  # d = 45 s
    assert p.delays_s == [pytest.approx(45.0)]
    assert p.idle[0] == pytest.approx(1 - (2 * p.step_s - 45.0) / p.step_s)
    assert not p.fresh_ok


def test_fifo_steady_state_cases():
    assert fifo_steady_state(np.array([1.0, 3.0, 4.0]), 5) == pytest.approx([1, 2, 1])
    assert fifo_steady_state(np.array([1.0, 3.0, 6.0]), 5) == pytest.approx([0, 0, 5])
    assert fifo_steady_state(np.array([1.0, 3.0, 6.0]), 5, drained=True) == pytest.approx([1, 2, 3])


def test_costs():
    w = Workload(8, 8, train_s=20.0, staleness=4, learner_cost_per_h=2.0)
    cls = [WorkerClass("w", 10.0, cost_per_h=0.5, availability=0.8)]
    p = evaluate(w, cls, [10])
    assert p.cost_per_h == pytest.approx(10 * 0.8 * 0.5 + 2.0)
    assert p.cost_per_step == pytest.approx(p.cost_per_h * p.step_s / 3600)
    assert p.cost_per_1k_samples == pytest.approx(p.cost_per_h / 3600 * 1000 / p.samples_per_s)


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError):
        WorkerClass("x", group_s=0)
    with pytest.raises(ValueError):
        WorkerClass("x", group_s=1, availability=1.5)
    with pytest.raises(ValueError):
        Workload(0, 8, 1.0)
    with pytest.raises(ValueError):
        evaluate(Workload(8, 8, 1.0), ONE, [1, 2])
    assert math.isinf(evaluate(Workload(8, 8, 1.0), ONE, [0]).step_s)
