"""``swarm-bench dashboard-overhead``: the pure parts (summary figures, render timing)."""

from __future__ import annotations

import pytest

from bench.dashboard_bench import render_times, summarise


def test_summary_overheads():
    out = summarise({"off": [10.0, 10.0, 12.0], "on": [10.5, 10.5, 12.0]}, {"off": [20.0, 20.0], "on": [21.0, 21.0]})
    assert out["off"]["median_s"] == 10.0 and out["on"]["median_s"] == 10.5
    assert out["overhead_pct_median"] == 5.0 and out["cpu_overhead_pct"] == 5.0
    assert out["overhead_pct_mean"] == pytest.approx(100 * (11.0 - 32 / 3) / (32 / 3), abs=0.01)


def test_render_times_reports_each_run_length():
    out = render_times([3, 30], repeats=2)
    assert out["3_steps_ms"] > 0 and out["30_steps_ms"] > 0 and len(out["loadavg"]) == 3
