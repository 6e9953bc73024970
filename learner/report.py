"""``swarm-learner report RUN_DIR``: a static HTML report of a finished run, with its plots.

Reads what a run leaves in its directory (``metrics.jsonl``, and when present ``config.toml``,
``swarm.json``, ``ledger.json``, ``summary.json``) and renders the dashboard's sections from
them (:mod:`learner.web.page`): reward, learner time, throughput charts as inline SVG, the nodes,
the ledger, the resolved config. One self-contained file: no script, nothing fetched.
"""

from __future__ import annotations

import json
import tomllib
from html import escape
from pathlib import Path
from typing import Any

from learner.ledger import work_columns
from learner.metrics import ROLLING_WINDOW, read_metrics
from learner.step_timing import CRITICAL_PARTS, OVERLAPPING_PARTS
from learner.web.page import page_html
from learner.watch import read_watch
from learner.web.state import ledger_from_counts, short, steps_view
from learner.web.watch_panel import watch_view


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text()) if path.exists() else None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def report_nodes(swarm: dict | None) -> list[dict]:
    """Node rows (the dashboard's columns) from ``swarm.json``."""
    out = []
    nodes, work = (swarm or {}).get("nodes") or {}, (swarm or {}).get("work") or {}
    for peer, n in sorted(nodes.items()):
        gen_s = float(n.get("gen_s") or 0.0)
        row = {
            "peer_id": peer, "short": short(peer), "name": n.get("name") or (work.get(peer) or {}).get("name", ""),
            "backend": n.get("backend", "?"), "device": n.get("device", "?"),
            "tokens_per_s": round(n.get("gen_tokens", 0) / gen_s, 1) if gen_s > 0 else None,
            "announced_tokens_per_s": n.get("tokens_per_s"), "rollouts": n.get("completions", 0),
            "groups": n.get("groups", 0), "rejected_groups": n.get("rejected_groups", 0),
        }
        for key in ("trusted", "reachable", "leaf", "stage"):
            if key in n:
                row[key] = n[key]
        if "link_role" in n:  # relay or leaf in the broadcast, and why (as the live dashboard shows it)
            row["link"], row["link_why"] = n["link_role"], n.get("link_why", "")
        row.update(work_columns(work.get(peer)))
        out.append(row)
    for peer, line in sorted(work.items()):  # nodes the run untrusted or forgot keep their ledger line
        if peer not in nodes:
            out.append({"peer_id": peer, "short": short(peer), "name": line.get("name", ""),
                        "backend": line.get("backend", "?"), "device": "?",
                        "groups": line.get("groups_pushed", 0), "rejected_groups": line.get("groups_rejected", 0),
                        **work_columns(line)})
    return out


def report_snapshot(run_dir: Path) -> dict:
    """A dashboard snapshot rebuilt from a run directory's files."""
    run_dir = Path(run_dir)
    metrics_path = run_dir / "metrics.jsonl"
    if not metrics_path.exists():
        raise FileNotFoundError(f"{metrics_path} not found: is {run_dir} a run directory?")
    try:
        rows = read_metrics(metrics_path)
    except json.JSONDecodeError as e:
        raise ValueError(f"{metrics_path}: a line is not valid JSON ({e})") from None
    cfg: dict = {}
    if (run_dir / "config.toml").exists():
        cfg = tomllib.loads((run_dir / "config.toml").read_text())
    steps = steps_view(rows)
    last = steps[-1] if steps else {}
    nodes = report_nodes(_read_json(run_dir / "swarm.json"))
    train, sync = cfg.get("train", {}), cfg.get("sync", {})
    mode = sync.get("mode", "sequential")
    status = {
        "run_id": run_dir.name, "run_dir": str(run_dir), "phase": "finished" if rows else "no steps",
        "model": cfg.get("model", {}).get("name", "?"), "task": cfg.get("task", {}).get("name", "?"),
        "mode": mode, "max_staleness": sync.get("max_staleness", 0) if mode == "async" else 0,
        "step": last.get("step", 0), "steps": train.get("steps", last.get("step", 0)),
        "version": last.get("policy_version", 0), "nodes": len(nodes), "uptime_s": last.get("wall_s"),
        "reward_mean": last.get("reward_mean"), "reward_rolling": last.get("reward_rolling"),
        "rolling_window": ROLLING_WINDOW, "samples_per_s": last.get("samples_per_s"),
        "samples": sum(s.get("samples", 0) for s in steps), "prompts_per_step": train.get("prompts_per_step", "?"),
        "group_size": train.get("group_size", "?"), "dissem_mode": cfg.get("dissem", {}).get("mode", "?"),
    }
    ledger = ledger_from_counts(_read_json(run_dir / "ledger.json") or {})
    dissem = {"mode": status["dissem_mode"], "codec": cfg.get("dissem", {}).get("codec", "?"),
              "members": len(nodes), "depth": 0, "versions": [], "tree": []}
    return {"status": status, "steps": steps, "nodes": nodes, "dissem": dissem, "ledger": ledger,
            "watch": watch_view(read_watch(run_dir))}


#: What each ``time_*`` field of the breakdown measures (``learner.step_timing``), for the table.
PART_LABELS = {
    "wait": "waiting for the batch", "reward": "reward scoring", "check": "behaviour check",
    "fwd_bwd": "forward/backward", "optim": "optimizer (clip + AdamW)", "train_other": "training call, other",
    "export": "adapter export", "encode": "adapter encode", "publish": "publish (hand to dissemination)",
    "other": "other (between the parts)", "gen": "generation (busiest node)", "gen_total": "generation (all nodes)",
    "verify": "verification (re-scoring)", "dissem": "dissemination to every node",
    "dissem_encode": "dissemination encode + sign",
}


def step_breakdown(rows: list[dict]) -> list[dict]:
    """Mean seconds per step of every ``time_*`` part and its share of the mean step time: the
    critical-path parts (they sum to the step time) then the parts inside the wait. Steps
    without a field do not count towards its mean; empty when no row has a breakdown."""
    rows = [r for r in rows if "time_wait_s" in r and r.get("step_time_s")]
    if not rows:
        return []
    step = sum(float(r["step_time_s"]) for r in rows) / len(rows)
    out = []
    for kind, parts in (("critical", CRITICAL_PARTS + ("other",)), ("inside wait", OVERLAPPING_PARTS)):
        for part in parts:
            vals = [float(r[f"time_{part}_s"]) for r in rows if r.get(f"time_{part}_s") is not None]
            if not vals:
                continue
            mean = sum(vals) / len(vals)
            out.append({"part": part, "label": PART_LABELS.get(part, part), "kind": kind, "mean_s": round(mean, 3),
                        "share": round(mean / step, 4) if step > 0 else 0.0, "steps": len(vals)})
    out.append({"part": "step", "label": "step time", "kind": "total", "mean_s": round(step, 3), "share": 1.0,
                "steps": len(rows)})
    return out


def breakdown_markdown(table: list[dict]) -> str:
    """The breakdown as a Markdown table (what ``docs/benchmarks.md`` shows)."""
    lines = ["| part | where | mean s/step | share of step |", "|---|---|---:|---:|"]
    for r in table:
        lines.append(f"| {r['label']} (`time_{r['part']}_s`) | {r['kind']} | {r['mean_s']:.3f} | {100 * r['share']:.1f}% |"
                     if r["part"] != "step" else
                     f"| **step time** (`step_time_s`) | | {r['mean_s']:.3f} | 100% |")
    return "\n".join(lines)


def _breakdown_html(table: list[dict]) -> str:
    if not table:
        return ""
    body = "".join(f"<tr><td>{escape(r['label'])}</td><td>{escape(r['kind'])}</td>"
                   f"<td style='text-align:right'>{r['mean_s']:.3f}</td>"
                   f"<td style='text-align:right'>{100 * r['share']:.1f}%</td></tr>" for r in table)
    return ("<h2>Step time breakdown</h2><p>Mean seconds per step. The critical-path parts sum to the step "
            "time; the parts inside the wait overlap it (nodes generating, pushes re-scored, versions "
            "disseminated).</p><table><tr><th>part</th><th>where</th><th>mean s</th><th>share of step</th></tr>"
            f"{body}</table>")


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the report; returns its path (default ``RUN_DIR/report.html``)."""
    run_dir = Path(run_dir)
    snap = report_snapshot(run_dir)
    html = page_html(snap, live=False, title=f"echo-swarm run {run_dir.name}")
    extra = [_breakdown_html(step_breakdown(read_metrics(run_dir / "metrics.jsonl")))]
    summary = _read_json(run_dir / "summary.json")
    if summary:
        extra.append(f"<h2>Summary</h2><pre>{escape(json.dumps(summary, indent=1))}</pre>")
    if (run_dir / "config.toml").exists():
        extra.append(f"<h2>Config</h2><pre>{escape((run_dir / 'config.toml').read_text())}</pre>")
    html = html.replace("</body>", "".join(extra) + "</body>", 1)
    out = Path(out) if out is not None else run_dir / "report.html"
    out.write_text(html)
    return out
