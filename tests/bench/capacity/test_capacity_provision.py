"""The branch-and-bound provisioner against brute force on small instances."""

from __future__ import annotations

import random

import pytest

from bench.capacity.model import Network, WorkerClass, Workload, evaluate
from bench.capacity.provision import brute_force, cheapest


def _instances(n: int, seed: int = 3):
    rng = random.Random(seed)
    for _ in range(n):
        classes = [WorkerClass(f"c{i}", rng.uniform(4, 40), cost_per_h=rng.choice([0.0, rng.uniform(0.05, 1.0)]),
                               availability=rng.choice([1.0, rng.uniform(0.5, 1.0)]), max_count=rng.randint(3, 9),
                               down_Bps=rng.choice([float("inf"), 3e6]), up_Bps=1e6)
                   for i in range(rng.choice([1, 2, 3]))]
        w = Workload(rng.randint(2, 10), 4, rng.uniform(10, 40), staleness=rng.randint(0, 3),
                     mode=rng.choice(["async", "async", "sequential"]))
        yield w, classes, rng.uniform(0.2, 1.0), Network(adapter_bytes=rng.choice([0.0, 4e6]), learner_up_Bps=6e6)


def test_matches_brute_force_on_small_instances():
    feasible = 0
    for w, classes, target, net in _instances(30):
        plan, brute = cheapest(w, classes, target, net), brute_force(w, classes, target, net)
        assert (plan is None) == (brute is None)
        if plan is None:
            continue
        feasible += 1
        cost = sum(n * c.availability * c.cost_per_h for c, n in zip(classes, plan.counts))
        assert cost == pytest.approx(brute[0], abs=1e-9)
        assert evaluate(w, classes, plan.counts, net).utilisation >= target - 1e-9
        assert all(0 <= n <= c.max_count for c, n in zip(classes, plan.counts))
    assert feasible >= 10


def test_prefers_the_cheaper_class_per_throughput_and_reports_margins():
    w = Workload(8, 8, train_s=20.0, staleness=4)
    slow_cheap = WorkerClass("cpu", 40.0, cost_per_h=0.05, max_count=50)  # 1.25 per group/s
    fast_dear = WorkerClass("gpu", 4.0, cost_per_h=1.0, max_count=5)  # 4.0 per group/s
    plan = cheapest(w, [fast_dear, slow_cheap], 0.9, Network())
    assert plan.counts == [0, 15]  # needs 0.36 groups/s: ceil(0.36 * 40) = 15 nodes
    assert plan.util_margin >= 0
    assert plan.capacity_margin == pytest.approx(15 / 40 / 0.36 - 1)
    assert plan.p_enough_online == 1.0


def test_infeasible_and_bad_target():
    w = Workload(8, 8, train_s=20.0, staleness=0)
    assert cheapest(w, [WorkerClass("w", 100.0, max_count=2)], 0.9) is None
    with pytest.raises(ValueError):
        cheapest(w, [WorkerClass("w", 1.0)], 1.5)
