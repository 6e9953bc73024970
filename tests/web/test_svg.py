"""Server-side SVG charts: points, gaps, ticks, escaping."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from learner.web.svg import Series, line_chart, nice_ticks

NS = "{http://www.w3.org/2000/svg}"


def test_chart_is_valid_svg_with_one_circle_per_point_and_gaps():
    svg = line_chart([Series("a<b", [(1, 0.5), (2, None), (3, 0.7), (4, 0.9)]),
                      Series("c", [(1, 1.0), (2, 2.0)], markers=False)], title="T & t", chart_id="x")
    root = ET.fromstring(svg)  # well-formed (names escaped)
    circles = root.findall(f"{NS}circle")
    assert [c.get("data-x") for c in circles] == ["1", "3", "4"] and circles[0].get("data-series") == "a<b"
    lines = root.findall(f"{NS}polyline")
    assert len(lines) == 2  # series a: one segment after the gap (a lone point draws no line); series c
    ys = [float(c.get("cy")) for c in circles]
    assert ys[0] > ys[1] > ys[2]  # higher values are drawn higher up
    assert root.get("id") == "x"


def test_empty_chart_says_so():
    assert "no data yet" in line_chart([Series("a", [])], title="t")
    assert "no data yet" in line_chart([Series("a", [(1, None)])], title="t")


def test_nice_ticks():
    assert nice_ticks(0, 1, 4) == [0, 0.25, 0.5, 0.75, 1.0]
    assert nice_ticks(1, 20, 6) == [5, 10, 15, 20]
    assert nice_ticks(3, 3) == [3.0, 3.2, 3.4, 3.6, 3.8, 4.0]  # an empty range becomes [lo, lo + 1]
    assert nice_ticks(-0.3, 0.1, 4) == [-0.3, -0.2, -0.1, 0.0, 0.1]
    assert nice_ticks(float("nan"), 1) == []


def test_non_finite_values_are_gaps():
    svg = line_chart([Series("a", [(1, 0.5), (2, float("nan")), (3, float("inf")), (4, 0.7)])], title="t")
    root = ET.fromstring(svg)
    assert [c.get("data-x") for c in root.findall(f"{NS}circle")] == ["1", "4"] and "nan" not in svg
