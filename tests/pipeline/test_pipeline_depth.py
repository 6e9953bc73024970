"""Groups in flight from the head's measured per-hop waits, and the throughput model they
follow: enough groups hide the round trips, and never more than the planned cap."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from swarm.pipeline.depth import groups_in_flight, pipeline_rate


def test_no_latency_needs_about_one_group_per_stage():
    # three equal stages, no round trip: a group's step is 3 stage-steps long
    assert groups_in_flight([0.02, 0.02, 0.02], [0.02, 0.02, 0.02], cap=16) == math.ceil(1.25 * 3)


def test_round_trips_call_for_more_groups_within_the_cap():
    busy = [0.02, 0.02, 0.02]
    wait = [0.02, 0.02 + 0.08, 0.02 + 0.08]  # the head's own stage, then two hops 40 ms each way
    assert groups_in_flight(busy, wait, cap=64) == math.ceil(1.25 * 0.22 / 0.02)  # 14
    assert groups_in_flight(busy, wait, cap=8) == 8
    assert groups_in_flight([0.0, 0.0], [0.0, 0.0], cap=8) == 2  # nothing measured yet
    assert groups_in_flight([0.0, 0.0], [0.0, 0.0], cap=1) == 1


def test_bad_measurements_are_refused():
    with pytest.raises(ValueError):
        groups_in_flight([0.1], [0.1, 0.2], cap=4)
    with pytest.raises(ValueError):
        groups_in_flight([float("nan")], [0.1], cap=4)
    with pytest.raises(ValueError):
        groups_in_flight([0.1], [0.1], cap=0)


@given(st.lists(st.tuples(st.floats(1e-3, 1.0), st.floats(0.0, 0.5)), min_size=1, max_size=8))
@example(hops=[(0.05, 0.0), (0.05, 0.5)])  # a whole depth (12) that rounding makes 13
def test_the_chosen_depth_reaches_the_compute_bound_rate(hops):
    busy = [b for b, _ in hops]
    rtt = [r for _, r in hops]
    wait = [b + r for b, r in hops]
    g = groups_in_flight(busy, wait, cap=10_000)
    assert pipeline_rate(busy, rtt, g) == pytest.approx(1 / max(busy))
    exact = groups_in_flight(busy, wait, cap=10_000, headroom=1.0)
    if exact > 1:  # without headroom, one group fewer leaves the slowest stage waiting ...
        fewer = pipeline_rate(busy, rtt, exact - 1)
        # ... unless the depth needed is a whole number that rounding pushed just above it
        assert fewer < 1 / max(busy) * (1 - 1e-9) or fewer == pytest.approx(1 / max(busy), rel=1e-9)


def test_in_flight_cap_is_the_tightest_stages_spare_memory():
    from swarm.pipeline.depth import in_flight_cap

    # 10 layers of 100 bytes; embedding 50, head 70; one group's KV is 10 bytes per layer
    stages = [(0, 4), (4, 10)]
    # stage 0: 1000 - 400 - 50 = 550 spare -> 550 // 40 = 13; stage 1: 1000 - 600 - 70 = 330 -> 330 // 60 = 5
    assert in_flight_cap(stages, 10, [1000, 1000], 100, 10, (50, 70), planned=2, most=16) == 5
    assert in_flight_cap(stages, 10, [1000, 1000], 100, 10, (50, 70), planned=2, most=4) == 4
    assert in_flight_cap(stages, 10, [1000, 700], 100, 10, (50, 70), planned=2, most=16) == 2  # never below the plan
    assert in_flight_cap(stages, 10, [1000, 1000], 100, 0, (50, 70), planned=3, most=16) == 3
