"""HTML of the dashboard's sections from a snapshot (:func:`learner.web.state.snapshot`).

Pure functions of the snapshot. The live page and ``swarm-learner report`` share them: the
live page replaces each section's inner HTML when a server-sent event brings a new version.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from learner.web.svg import Series, line_chart
from learner.web.watch_panel import WATCH_SECTIONS, watch_sections

#: Section element id -> heading.
SECTIONS = {"status": "Run", "charts": "Progress", **WATCH_SECTIONS, "nodes": "Nodes", "ledger": "Ledger",
            "dissem": "Adapter dissemination"}
#: ``eval_*`` fields of the step rows drawn on the reward chart (the held-out panel shows the
#: rest: ``learner/web/watch_panel.py``).
EVAL_ON_REWARD_CHART = ("eval_accuracy",)
#: Charts of longer runs than this (steps) draw lines only: a circle per step would make every
#: update heavy for the browser and for the learner's loop.
MAX_MARKERS = 200

CSS = """
body{font-family:system-ui,sans-serif;margin:16px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 8px} h2{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse;font-size:13px;background:#fff}
td,th{border:1px solid #ddd;padding:3px 7px;text-align:right} th{background:#f0f0f0}
td.l,th.l{text-align:left} .kv td:first-child{text-align:left;color:#555}
.charts{display:flex;flex-wrap:wrap;gap:8px} .chart{background:#fff;border:1px solid #ddd}
.big{font-size:22px;font-weight:bold} .muted{color:#888;font-size:12px}
.ok{color:#080} .bad{color:#b00} #conn{float:right}
ul.tree{margin:2px 0 2px 14px;padding:0;font-family:monospace;font-size:12px}
"""

LIVE_JS = """
(function(){
  var conn=document.getElementById('conn');
  var es=new EventSource('api/events');
  es.addEventListener('sections',function(ev){
    var data=JSON.parse(ev.data);
    for(var id in data){var el=document.getElementById(id); if(el){el.innerHTML=data[id];}}
    conn.textContent='live, updated '+new Date().toLocaleTimeString(); conn.className='ok';
  });
  es.onerror=function(){conn.textContent='disconnected (retrying)'; conn.className='bad';};
})();
"""


def _v(value: Any, fmt: str = "{}") -> str:
    if value is None:
        return "&ndash;"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return escape(fmt.format(value))


def status_html(st: dict) -> str:
    rows = [
        ("phase", _v(st["phase"])), ("run", _v(st["run_id"])), ("model", _v(st["model"])),
        ("task", _v(st["task"])),
        ("mode", _v(st["mode"] + (f" (staleness <= {st['max_staleness']})" if st["mode"] == "async" else ""))),
        ("batch", _v(f"{st['prompts_per_step']} prompts x {st['group_size']} completions")),
        ("adapter version", _v(st["version"])), ("nodes", _v(st["nodes"])),
        (f"reward (rolling {st['rolling_window']})", _v(st["reward_rolling"], "{:.3f}")),
        ("samples/s", _v(st["samples_per_s"], "{:.2f}")), ("samples trained", _v(st["samples"])),
        ("dissemination", _v(st["dissem_mode"])), ("uptime", _v(st["uptime_s"], "{:.0f} s")),
    ]
    table = "".join(f"<tr><td>{k}</td><td class=l>{v}</td></tr>" for k, v in rows)
    return (f'<div class="big">step <span id="step-now">{st["step"]}</span> / {st["steps"]}'
            f' &middot; reward <span id="reward-now">{_v(st["reward_mean"], "{:.3f}")}</span></div>'
            f'<table class="kv">{table}</table>')


def charts_key(snap: dict) -> tuple:
    """What :func:`charts_html` depends on (equal keys, equal charts): lets callers cache it."""
    steps = snap["steps"]
    return (len(steps), tuple(sorted(steps[-1].items())) if steps else (),
            tuple((v["version"], v["last_s"]) for v in snap["dissem"]["versions"]))


def charts_html(snap: dict) -> str:
    steps = snap["steps"]
    xs = [s["step"] for s in steps]
    markers = len(steps) <= MAX_MARKERS
    reward = [Series("reward", [(x, s.get("reward_mean")) for x, s in zip(xs, steps)], markers=markers),
              Series("rolling mean", [(x, s.get("reward_rolling")) for x, s in zip(xs, steps)], markers=False, width=2.5)]
    eval_keys = [k for k in EVAL_ON_REWARD_CHART if any(k in s for s in steps)]
    for k in eval_keys:
        reward.append(Series(k.removeprefix("eval_"), [(x, s[k]) for x, s in zip(xs, steps) if k in s], line=False))
    times = [Series("learner idle", [(x, s.get("learner_idle_s")) for x, s in zip(xs, steps)], markers=markers),
             Series("train", [(x, s.get("train_s")) for x, s in zip(xs, steps)], markers=markers)]
    rate = [Series("samples/s", [(x, s.get("samples_per_s")) for x, s in zip(xs, steps)], markers=markers)]
    versions = sorted(snap["dissem"]["versions"], key=lambda v: v["version"])
    diss = [Series("last node", [(v["version"], v["last_s"]) for v in versions])]
    return "".join([
        line_chart(reward, title="Reward per step", y_label="reward", y_min=0.0, y_max=1.0, chart_id="reward-chart"),
        line_chart(times, title="Learner time per step", y_label="seconds", y_min=0.0, chart_id="time-chart"),
        line_chart(rate, title="Throughput", y_label="samples/s", y_min=0.0, chart_id="rate-chart"),
        line_chart(diss, title="Adapter delivery time", y_label="seconds", x_label="version", y_min=0.0,
                   chart_id="dissem-chart"),
    ])


NODE_COLUMNS = [("short", "peer", "{}"), ("name", "name", "{}"), ("backend", "backend", "{}"),
                ("device", "device", "{}"), ("tokens_per_s", "tok/s", "{:.0f}"),
                ("announced_tokens_per_s", "tok/s (hello)", "{:.0f}"), ("adapter_version", "adapter", "v{}"),
                ("lag", "lag", "{}"), ("push_staleness", "buffered lag", "{}"), ("rollouts", "rollouts", "{}"), ("rejected_groups", "rejected", "{}"),
                ("leased_groups", "leased", "{}"), ("last_seen_s", "seen", "{:.0f} s ago"),
                ("trusted", "trusted", "{}"), ("reachable", "reachable", "{}"), ("leaf", "leaf", "{}"),
                ("stage", "stage", "{}"), ("link", "link", "{}"),
                ("trained_groups", "trained groups", "{}"), ("verified", "verified by", "{}"),
                ("failed_checks", "failed checks", "{}"), ("trained_by", "trained after", "{}")]


#: Node columns whose cell shows another field when pointed at: the full peer id, why the node
#: relays or is a leaf (``swarm.discovery.links.relay_role``).
CELL_TITLES = {"short": "peer_id", "link": "link_why"}

#: Node columns shown even when empty for every node (the others appear once some node has a value).
ALWAYS_SHOWN = {"short", "backend", "device", "tokens_per_s", "adapter_version", "lag", "rollouts", "last_seen_s"}


def nodes_html(nodes: list[dict]) -> str:
    if not nodes:
        return '<p class="muted">no node has joined yet</p>'
    cols = [c for c in NODE_COLUMNS if any(n.get(c[0]) not in (None, "") for n in nodes) or c[0] in ALWAYS_SHOWN]
    head = "".join(f"<th>{escape(title)}</th>" for _, title, _ in cols)
    body = []
    for n in nodes:
        cells = "".join(f'<td title="{escape(str(n.get(CELL_TITLES.get(key, "")) or ""))}">'
                        f'{_v(n.get(key), fmt)}</td>' for key, _, fmt in cols)
        body.append(f'<tr class="node" data-peer="{escape(n["peer_id"])}" data-backend="{escape(str(n["backend"]))}">'
                    f"{cells}</tr>")
    return f'<table id="nodes-table"><tr>{head}</tr>{"".join(body)}</table>'


def ledger_html(ledger: dict) -> str:
    cells = [("pending", ledger["pending"]), ("leased", ledger["leased"]), ("held (verifying)", ledger["held"]),
             ("completed (buffered)", ledger["completed"]),
             ("trained", ledger["trained"]), ("dropped", ledger["dropped_total"]), ("total", ledger["total"])]
    row = "".join(f"<td>{v}</td>" for _, v in cells)
    head = "".join(f"<th>{k}</th>" for k, _ in cells)
    drops = ", ".join(f"{escape(r)}: {n}" for r, n in ledger["dropped"].items()) or "none"
    return f'<table id="ledger-table"><tr>{head}</tr><tr>{row}</tr></table><p class="muted">drops by reason: {drops}</p>'


def _tree_html(nodes: list[dict]) -> str:
    if not nodes:
        return ""
    return "<ul class=tree>" + "".join(f"<li>{escape(n['peer'])}{_tree_html(n['children'])}</li>" for n in nodes) + "</ul>"


def dissem_html(d: dict) -> str:
    head = (f'<p class="muted">mode {escape(str(d["mode"]))}, codec {escape(str(d.get("codec", "?")))}, '
            f'{d["members"]} registered node(s), tree depth {d.get("depth", 0)}</p>')
    if not d["versions"]:
        return head + '<p class="muted">no version broadcast yet</p>'
    peers = sorted({p for v in d["versions"] for p in v["deliveries"]})
    rows = []
    for v in d["versions"]:
        cells = "".join(f"<td>{_v((v['deliveries'].get(p) or {}).get('seconds'), '{:.2f} s')}</td>" for p in peers)
        rows.append(f"<tr><td>v{v['version']}</td>{cells}</tr>")
    table = (f'<table id="dissem-table"><tr><th>version</th>{"".join(f"<th>{escape(p)}</th>" for p in peers)}</tr>'
             f'{"".join(rows)}</table>')
    trees = "".join(f'<div class="muted">stripe {i}: learner{_tree_html(t)}</div>' for i, t in enumerate(d["tree"]))
    return head + table + (f'<p class="muted">broadcast tree (chunks of stripe i go down tree i)</p>{trees}'
                           if trees else "")


def sections(snap: dict, charts: str | None = None) -> dict[str, str]:
    """Section id -> inner HTML (``charts``: the charts already rendered for this snapshot)."""
    return {"status": status_html(snap["status"]), "charts": charts if charts is not None else charts_html(snap),
            "nodes": nodes_html(snap["nodes"]), **watch_sections(snap.get("watch")),
            "ledger": ledger_html(snap["ledger"]), "dissem": dissem_html(snap["dissem"])}


def page_html(snap: dict, *, live: bool, title: str = "echo-swarm learner") -> str:
    """The whole page; ``live`` adds the script that follows ``api/events``."""
    parts = sections(snap)
    body = "".join(
        f'<h2>{escape(SECTIONS[k])}</h2><div id="{k}"{" class=charts" if k == "charts" else ""}>{parts[k]}</div>'
        for k in SECTIONS)
    conn = '<span id="conn" class="muted">connecting&hellip;</span>' if live else ""
    data = json.dumps(snap).replace("</", "<\\/")  # a JSON island may not close its script element
    script = f"<script>{LIVE_JS}</script>" if live else f'<script type="application/json" id="snapshot">{data}</script>'
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"<style>{CSS}</style></head><body>{conn}<h1>{escape(title)}</h1>{body}{script}</body></html>")
