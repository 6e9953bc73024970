"""Line charts drawn server-side as SVG text: no JavaScript library, nothing fetched.

:func:`line_chart` is a pure function of its series; every data point is a ``<circle
class="pt">`` carrying ``data-series`` and ``data-x``, so a page (or a test) can count them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

#: Colours of successive series (colour-blind-safe palette).
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00")


@dataclass
class Series:
    name: str
    #: (x, y) points; a ``None`` (or non-finite) y is skipped (no point, the line breaks).
    points: list[tuple[float, float | None]] = field(default_factory=list)
    color: str = ""
    #: Draw a circle at each point.
    markers: bool = True
    #: Draw the connecting line.
    line: bool = True
    width: float = 1.5


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t <= hi + step * 1e-9:
        if t >= lo - step * 1e-9:
            ticks.append(round(t, 10))
        t += step
    return ticks


def _fmt(v: float) -> str:
    if v == int(v) and abs(v) < 1e6:
        return str(int(v))
    return f"{v:.3g}"


def line_chart(series: list[Series], *, title: str, y_label: str = "", x_label: str = "step",
               width: int = 560, height: int = 220, y_min: float | None = None,
               y_max: float | None = None, chart_id: str = "") -> str:
    """An SVG line chart of ``series`` (an empty chart says "no data yet")."""
    left, right, top, bottom = 48, 12, 26, 34
    series = [Series(s.name, [(x, y if y is not None and math.isfinite(y) else None) for x, y in s.points],
                     s.color, s.markers, s.line, s.width) for s in series]  # NaN/inf: a gap
    pw, ph = width - left - right, height - top - bottom
    xs = [x for s in series for x, y in s.points if y is not None]
    ys = [y for s in series for _, y in s.points if y is not None]
    ident = f' id="{escape(chart_id)}"' if chart_id else ""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg"{ident} class="chart" viewBox="0 0 {width} {height}" '
           f'width="{width}" height="{height}" role="img" aria-label="{escape(title)}">',
           f'<text x="{left}" y="16" class="title" font-size="13" font-weight="bold">{escape(title)}</text>']
    if not xs:
        out.append(f'<text x="{left + pw / 2}" y="{top + ph / 2}" text-anchor="middle" fill="#888" '
                   f'font-size="12">no data yet</text></svg>')
        return "".join(out)
    x_lo, x_hi = min(xs), max(xs)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    y_lo = min(ys) if y_min is None else min(y_min, min(ys))
    y_hi = max(ys) if y_max is None else max(y_max, max(ys))
    if y_hi == y_lo:
        y_lo, y_hi = y_lo - 0.5, y_hi + 0.5
    if y_max is None:
        y_hi += 0.08 * (y_hi - y_lo)  # headroom above the data

    def px(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * pw

    def py(y: float) -> float:
        return top + ph - (y - y_lo) / (y_hi - y_lo) * ph

    for t in nice_ticks(y_lo, y_hi, 4):
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#ddd"/>'
                   f'<text x="{left - 4}" y="{py(t) + 4:.1f}" text-anchor="end" font-size="10">{_fmt(t)}</text>')
    x_ticks = [t for t in nice_ticks(x_lo, x_hi, 6) if float(t).is_integer()] or [x_lo, x_hi]  # steps, versions
    for t in x_ticks:
        out.append(f'<text x="{px(t):.1f}" y="{top + ph + 14}" text-anchor="middle" font-size="10">{_fmt(t)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 4}" text-anchor="middle" font-size="11">{escape(x_label)}</text>')
    if y_label:
        out.append(f'<text transform="translate(11 {top + ph / 2}) rotate(-90)" text-anchor="middle" '
                   f'font-size="11">{escape(y_label)}</text>')
    legend_x = float(left + pw)
    for i, s in enumerate(series):
        color = s.color or PALETTE[i % len(PALETTE)]
        name = escape(s.name)
        segments: list[list[str]] = [[]]
        for x, y in s.points:
            if y is None:
                segments.append([])
            else:
                segments[-1].append(f"{px(x):.1f},{py(y):.1f}")
        if s.line:
            for seg in segments:
                if len(seg) > 1:
                    out.append(f'<polyline fill="none" stroke="{color}" stroke-width="{s.width}" '
                               f'points="{" ".join(seg)}"/>')
        if s.markers:
            for x, y in s.points:
                if y is not None:
                    out.append(f'<circle class="pt" data-series="{name}" data-x="{_fmt(x)}" cx="{px(x):.1f}" '
                               f'cy="{py(y):.1f}" r="2.5" fill="{color}"><title>{name} {_fmt(x)}: {y:.4g}</title></circle>')
        legend_x -= 8 + 6.5 * len(s.name) + 14
        out.append(f'<rect x="{legend_x:.0f}" y="8" width="10" height="10" fill="{color}"/>'
                   f'<text x="{legend_x + 14:.0f}" y="17" font-size="11">{name}</text>')
    out.append("</svg>")
    return "".join(out)
