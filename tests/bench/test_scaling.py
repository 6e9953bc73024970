"""The scaling table's fits and the extrapolation to the papers' sizes (``swarm-bench scaling``)."""

from __future__ import annotations

import math

from bench.scaling import power_fit, table
from bench.scaling_extrapolate import TARGETS, extrapolate, shape_params


def test_a_power_law_is_fitted_exactly_and_too_few_points_give_none():
    xs = [1.35e8, 4.94e8, 1.54e9]
    a, b = power_fit(xs, [3.0 * (x / 1e9) ** 0.9 for x in xs])
    assert math.isclose(a, 3.0, rel_tol=1e-9) and math.isclose(b, 0.9, rel_tol=1e-9)
    assert power_fit(xs[:1], [1.0]) is None and power_fit(xs, [None, None, 2.0]) is None


def test_the_table_leaves_unmeasured_cells_empty_and_fits_the_rest():
    res = {("model", "135m"): {"params": 1.35e8}, ("model", "1.5b"): {"params": 1.54e9},
           ("learner", "135m"): {"step_s": 2.0, "peak_gib": 1.8}, ("learner", "1.5b"): {"step_s": 20.0}}
    lines, fits = table(res, ["135m", "1.5b"])
    step = next(line for line in lines if line.startswith("| learner step s |"))
    assert "| 2 | 20 |" in step and "N^0.95" in step
    assert next(line for line in lines if line.startswith("| learner peak GiB |")).endswith("| 1.8 | - |  |")
    assert "learner step s" in fits and "learner peak GiB" not in fits


def test_the_qwen3_shapes_have_their_published_sizes():
    sizes = {name: shape_params(name)[0] / 1e9 for name in TARGETS}
    assert 3.9 < sizes["qwen3-4b"] < 4.1 and 8.0 < sizes["qwen3-8b"] < 8.4 and 32.5 < sizes["qwen3-32b"] < 33.0


def test_the_extrapolation_says_what_is_assumed_and_takes_the_cheapest_staleness():
    res = {("adapter", "1.5b"): {"bytes_per_param": {"delta_int3": 0.398}}}
    text = extrapolate({}, res)
    assert "ASSUMED" in text and "0.398 bytes per adapter parameter (measured)" in text
    rows = [line for line in text.splitlines() if line.startswith("| qwen3-")]
    assert len(rows) == 3 * len(TARGETS)
    for row in rows:
        cost = row.split(" | ")[-3]
        assert cost == "-" or "(S=" in cost  # the cheapest S >= 1, named
