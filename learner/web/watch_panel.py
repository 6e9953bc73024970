"""The dashboard's held-out curve and sampled-completions panels, from :class:`learner.watch.WatchStats`.

:func:`watch_view` turns the typed snapshot into the JSON-ready ``watch`` part of a dashboard
snapshot (``/api/watch``); :func:`watch_sections` renders its two sections (pure functions), shared
by the live page and ``swarm-learner report`` (which rebuilds the snapshot from
``eval.jsonl`` and ``completions.jsonl``: :func:`learner.watch.read_watch`).
"""

from __future__ import annotations

import dataclasses
from html import escape
from typing import Any

from learner.watch import WatchStats
from learner.web.svg import Series, line_chart

#: Section element id -> heading (placed after the progress charts).
WATCH_SECTIONS = {"heldout": "Held-out evaluation", "samples": "Sampled completions"}
#: Characters of a question or completion shown in a table cell (the whole text is its tooltip).
CELL_CHARS = 160
#: The table's columns: record field -> heading.
SHOWN = {"step": "step", "version": "adapter", "peer": "node", "question": "question", "completion": "completion",
         "answer": "answer", "reward": "reward", "advantage": "advantage", "tokens": "tokens"}


def watch_view(stats: WatchStats) -> dict[str, Any]:
    """The JSON-ready ``watch`` part of a dashboard snapshot (pure)."""
    return {"evals": [dataclasses.asdict(p) for p in stats.evals],
            "completions": [dataclasses.asdict(r) for r in stats.completions],
            "eval_samples": [dataclasses.asdict(r) for r in stats.eval_samples]}


def with_watch(snap: dict[str, Any], stats: WatchStats) -> dict[str, Any]:
    """``snap`` (a dashboard snapshot) with its ``watch`` part."""
    snap["watch"] = watch_view(stats)
    return snap


def heldout_html(evals: list[dict]) -> str:
    if not evals:
        return '<p class="muted">no held-out evaluation yet (<code>[eval]</code>: every, n, on_start)</p>'
    xs = [e["step"] for e in evals]
    chart = line_chart([Series("accuracy", [(x, e["accuracy"]) for x, e in zip(xs, evals)], width=2.5),
                        Series("95% CI low", [(x, e["ci_low"]) for x, e in zip(xs, evals)], markers=False, width=1),
                        Series("95% CI high", [(x, e["ci_high"]) for x, e in zip(xs, evals)], markers=False, width=1),
                        Series("mean reward", [(x, e["mean_reward"]) for x, e in zip(xs, evals)], line=False)],
                       title="Held-out accuracy", y_label="accuracy", y_min=0.0, y_max=1.0, chart_id="heldout-chart")
    rows = "".join(f"<tr><td>{e['step']}</td><td>v{e['version']}</td><td>{e['correct']}/{e['n']}</td>"
                   f"<td>{e['accuracy']:.3f}</td><td>[{e['ci_low']:.3f}, {e['ci_high']:.3f}]</td>"
                   f"<td>{e['mean_reward']:.3f}</td><td>{e['seconds']:.1f} s</td></tr>" for e in evals)
    table = ('<table id="heldout-table"><tr><th>step</th><th>adapter</th><th>correct</th><th>accuracy</th>'
             f'<th>95% CI</th><th>mean reward</th><th>took</th></tr>{rows}</table>')
    return f'<div class="charts">{chart}</div>{table}'


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "<td>&ndash;</td>"
    if isinstance(value, float):
        return f"<td>{value:+.3f}</td>" if key == "advantage" else f"<td>{value:.3f}</td>"
    text = str(value)
    if key == "peer" and len(text) > 12:  # a peer id: its last characters, as the nodes table shows it
        return f'<td title="{escape(text)}">{escape(text[-6:])}</td>'
    short = text if len(text) <= CELL_CHARS else text[:CELL_CHARS] + "\u2026"
    if key in ("question", "completion", "answer"):
        return f'<td class=l title="{escape(text)}">{escape(short)}</td>'
    return f"<td>{escape(short)}</td>"


def completions_table(records: list[dict], table_id: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in SHOWN.values())
    body = "".join("<tr class=completion>" + "".join(_cell(k, r.get(k)) for k in SHOWN) + "</tr>" for r in records)
    return f'<table id="{table_id}"><tr>{head}</tr>{body}</table>'


def samples_html(completions: list[dict], eval_samples: list[dict]) -> str:
    parts = []
    if completions:
        parts.append(f'<p class="muted">training step {completions[0]["step"]}: the learner\'s reward and the '
                     f'GRPO advantage of each completion</p>' + completions_table(completions, "completions-table"))
    if eval_samples:
        parts.append(f'<p class="muted">held-out answers at step {eval_samples[0]["step"]}</p>'
                     + completions_table(eval_samples, "eval-samples-table"))
    return "".join(parts) or '<p class="muted">none yet (<code>report.completions_every</code>)</p>'


def watch_sections(view: dict[str, Any] | None) -> dict[str, str]:
    """Section id -> inner HTML of the two panels (``view``: a snapshot's ``watch`` part, None when
    the learner has none)."""
    view = view or {"evals": [], "completions": [], "eval_samples": []}
    return {"heldout": heldout_html(view["evals"]), "samples": samples_html(view["completions"], view["eval_samples"])}
