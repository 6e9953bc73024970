"""The event simulator against the model where the model's assumptions hold, and where they break."""

from __future__ import annotations

import time

import pytest

from bench.capacity.model import Network, WorkerClass, Workload, evaluate
from bench.capacity.simulate import SimConfig, simulate

W10 = WorkerClass("w", 10.0)


@pytest.mark.parametrize("S,n", [(0, 40), (1, 20), (1, 60), (2, 30), (4, 15), (4, 100)])
def test_agrees_with_model_for_many_identical_nodes(S, n):
    w = Workload(32, 8, train_s=20.0, staleness=S)
    p, s = evaluate(w, [W10], [n]), simulate(w, [W10], [n], cfg=SimConfig(steps=200))
    assert s.utilisation == pytest.approx(p.utilisation, rel=0.03)
    assert s.samples_per_s == pytest.approx(p.samples_per_s, rel=0.03)
    assert s.mean_lag == pytest.approx(p.mean_lag, abs=0.1)
    assert s.wasted == pytest.approx(p.wasted, abs=0.03)


def test_agrees_with_model_through_a_tree_and_mixed_classes():
    net = Network(adapter_bytes=20e6, learner_up_Bps=12.5e6, fanout=4)
    cls = [WorkerClass("a", 12.0, down_Bps=6e6, up_Bps=2e6), WorkerClass("b", 5.0, down_Bps=12e6, up_Bps=6e6)]
    w = Workload(32, 8, train_s=15.0, staleness=2)
    for counts in ([20, 10], [10, 25], [0, 40]):
        p, s = evaluate(w, cls, counts, net), simulate(w, cls, counts, net, SimConfig(steps=200))
        assert s.utilisation == pytest.approx(p.utilisation, rel=0.05)
        assert s.samples_per_s == pytest.approx(p.samples_per_s, rel=0.05)


def test_sequential_matches_exactly_without_noise():
    w = Workload(16, 8, train_s=20.0, mode="sequential")
    for n in (3, 16, 20):
        p, s = evaluate(w, [W10], [n]), simulate(w, [W10], [n], cfg=SimConfig(steps=50))
        assert s.step_s == pytest.approx(p.step_s, rel=1e-9)


def test_stragglers_and_churn_break_the_fluid_assumptions():
    w = Workload(32, 8, train_s=20.0, staleness=1)
    # 20% of groups take 5x: mean group time 18 s; the model fed that mean misses the late groups
    straggly = simulate(w, [W10], [16], cfg=SimConfig(steps=150, straggler_prob=0.2, straggler_factor=5.0))
    mean_model = evaluate(w, [WorkerClass("w", 18.0)], [16])
    assert straggly.utilisation < mean_model.utilisation - 0.03
    assert straggly.wasted > mean_model.wasted + 0.05
    churny_cls = [WorkerClass("w", 10.0, availability=0.5, session_s=30.0)]
    churny = simulate(w, churny_cls, [40], cfg=SimConfig(steps=150))
    assert churny.lost_groups > 50  # groups in flight when nodes leave
    assert churny.utilisation < evaluate(w, churny_cls, [40]).utilisation - 0.02


def test_few_nodes_synchronise_through_a_slow_star():
    # every node gets the adapter at once, 96 s after publication: the fluid phases are gone,
    # step lengths alternate, but the mean period still matches the model within a few %
    w = Workload(64, 8, train_s=20.0, staleness=1)
    cls = [WorkerClass("b", 10.0, down_Bps=12.5e6, up_Bps=5e6)]
    net = Network(adapter_bytes=20e6, learner_up_Bps=12.5e6, topology="star")
    p, s = evaluate(w, cls, [60], net), simulate(w, cls, [60], net, SimConfig(steps=100))
    gaps = {round(b - a, 6) for a, b in zip(s.step_ends[20:], s.step_ends[21:])}
    assert len(gaps) > 1
    assert s.step_s == pytest.approx(p.step_s, rel=0.05)


@pytest.mark.slow
def test_ten_thousand_workers_thousand_steps_under_a_minute():
    w = Workload(512, 16, train_s=30.0, staleness=4)
    cls = [WorkerClass("laptop", 240.0, availability=0.9, session_s=3600.0, down_Bps=50e6 / 8, up_Bps=20e6 / 8),
           WorkerClass("gpu", 60.0, down_Bps=500e6 / 8, up_Bps=100e6 / 8)]
    net = Network(adapter_bytes=40e6, learner_up_Bps=1e9 / 8, fanout=8)
    t0 = time.perf_counter()
    s = simulate(w, cls, [8000, 2000], net, SimConfig(steps=1000, jitter_cv=0.2, straggler_prob=0.02))
    assert time.perf_counter() - t0 < 60.0
    assert len(s.step_ends) == 1000
