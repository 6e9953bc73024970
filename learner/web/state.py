"""Read-only snapshots of the learner's live objects for the dashboard, the API and ``/metrics``.

Every function here only reads attributes (never a method that changes state, such as
``Coordinator.take_drop_counts``) and returns plain JSON-ready dicts and lists. The
functions over parts (:func:`steps_view`, :func:`nodes_view`, :func:`dissem_view`,
:func:`ledger_view`) are pure: same objects and clock in, same dict out. Fields that not every
version of the learner has (a node's trust, reachability or pipeline stage) are read with
defaults and shown only when present.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from learner.ledger import work_columns
from learner.metrics import ROLLING_WINDOW

#: Per-step keys the dashboard keeps from a ``metrics.jsonl`` row (plus every ``eval_*`` key).
STEP_KEYS = ("step", "policy_version", "reward_mean", "samples", "samples_per_s", "learner_idle_s",
             "train_s", "step_time_s", "staleness_max", "wall_s", "clip_frac", "buffer_groups")
#: Versions of dissemination shown (newest first).
DISSEM_VERSIONS_SHOWN = 12
#: Node attributes shown when the learner has them: attribute -> column name.
OPTIONAL_NODE_FIELDS = {"trusted": "trusted", "reachable": "reachable", "leaf": "leaf", "stage": "stage"}


@dataclass
class DashboardSource:
    """What the dashboard reads: references to the learner's live objects (never driven)."""

    #: The resolved ``LearnerConfig``.
    cfg: Any
    #: The ``LearnerService`` (nodes, coordinator, dissemination service).
    service: Any
    #: Anything with a ``rows`` list of metrics rows (``MetricsWriter``).
    metrics: Any
    #: The loop's ``LoopState`` (step, version).
    state: Any
    #: The run directory (shown only).
    run_dir: str
    #: Wall-clock time the learner started.
    started_at: float
    #: The service's clock (``trio.current_time``: node ``last_seen`` uses it).
    clock: Callable[[], float] = time.monotonic
    #: The per-step view, updated with new rows only.
    steps: StepsView = field(default_factory=lambda: StepsView())


def short(peer_id: str) -> str:
    return peer_id[-6:]


class StepsView:
    """:func:`steps_view` kept up to date incrementally (metrics rows are only ever appended),
    so a long run costs the dashboard the new rows only."""

    def __init__(self) -> None:
        self.out: list[dict] = []
        self._rewards: list[float] = []

    def update(self, rows: list[dict]) -> list[dict]:
        if len(rows) < len(self.out):
            self.__init__()
        for row in rows[len(self.out):]:
            self._rewards.append(float(row.get("reward_mean", 0.0)))
            window = self._rewards[-ROLLING_WINDOW:]
            kept = {k: row[k] for k in STEP_KEYS if k in row}
            kept.update({k: v for k, v in row.items() if k.startswith("eval_") and isinstance(v, (int, float))})
            kept["reward_rolling"] = round(sum(window) / len(window), 4)
            self.out.append(kept)
        return self.out


def steps_view(rows: list[dict]) -> list[dict]:
    """Per step: the kept keys of each row plus the rolling mean reward (as ``rolling_mean``)."""
    return StepsView().update(rows)


def _held_versions(coord, dissem) -> dict[str, int]:
    """Peer -> newest adapter version it is known to hold (dissemination reports, leases, pushes)."""
    held: dict[str, int] = {}
    for version, reports in (getattr(dissem, "have", None) or {}).items():
        for peer in reports:
            held[peer] = max(held.get(peer, -1), version)
    for lease in (getattr(coord, "leases", None) or {}).values():
        held[lease.peer_id] = max(held.get(lease.peer_id, -1), lease.version)
    for group in (getattr(coord, "completed", None) or {}).values():
        held[group.peer_id] = max(held.get(group.peer_id, -1), group.result.version)
    return held


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def nodes_view(service, now: float) -> list[dict]:
    """One dict per node that said hello: identity, hardware, speed, adapter held, contribution."""
    coord = service.coordinator
    current = getattr(coord, "version", 0)
    dissem = getattr(service, "dissem", None)
    held = _held_versions(coord, dissem)
    members = getattr(dissem, "members", None) or {}
    link_summary = getattr(dissem, "link_summary", None)
    roles = link_summary().get("roles", {}) if callable(link_summary) else {}
    oldest_pushed: dict[str, int] = {}  # peer -> oldest version among its rollouts not yet trained
    for group in (getattr(coord, "completed", None) or {}).values():
        v = group.result.version
        oldest_pushed[group.peer_id] = min(oldest_pushed.get(group.peer_id, v), v)
    leased: dict[str, int] = {}
    for lease in (getattr(coord, "leases", None) or {}).values():
        leased[lease.peer_id] = leased.get(lease.peer_id, 0) + len(lease.open_groups or lease.group_ids)
    out = []
    ledger = getattr(service, "ledger", None)
    work = ledger.summary() if ledger is not None else {}
    for peer, n in sorted(service.nodes.items()):
        hello = n.hello
        gen_s = float(getattr(n, "gen_s", 0.0))
        version = held.get(peer)
        row = {
            "peer_id": peer,
            "short": short(peer),
            "name": str((getattr(hello, "extra", None) or {}).get("name", "")) or getattr(hello, "name", "") or "",
            "backend": getattr(hello, "backend", "?"),
            "device": getattr(hello, "device", "?"),
            "memory_gib": round(getattr(hello, "memory_bytes", 0) / 2**30, 2),
            "announced_tokens_per_s": round(float(getattr(hello, "tokens_per_s", 0.0)), 1),
            "tokens_per_s": round(getattr(n, "gen_tokens", 0) / gen_s, 1) if gen_s > 0 else None,
            "adapter_version": version,
            "lag": current - version if version is not None else None,
            "push_staleness": current - oldest_pushed[peer] if peer in oldest_pushed else None,
            "rollouts": getattr(n, "completions_pushed", 0),
            "groups": getattr(n, "groups_pushed", 0),
            "rejected_groups": getattr(n, "rejected_groups", 0),
            "leased_groups": leased.get(peer, 0),
            "last_seen_s": round(max(0.0, now - n.last_seen), 1),
            "in_broadcast": peer in members,
        }
        row.update(work_columns(work.get(peer)))  # the work ledger: trained, verified by which test
        if peer in roles:  # relay or leaf in the broadcast, and why (swarm/discovery/links.py)
            row["link"], row["link_why"] = roles[peer]["kind"], roles[peer]["why"]
        for attr, column in OPTIONAL_NODE_FIELDS.items():
            value = getattr(n, attr, None)
            if value is None:
                value = getattr(hello, attr, None)
            if value is not None:
                row[column] = _plain(value)
        out.append(row)
    return out


def _tree(nodes) -> list[dict]:
    return [{"peer": short(t.peer_id), "children": _tree(t.children)} for t in nodes]


def dissem_view(dissem) -> dict:
    """Per version: when its broadcast started and how long each node took to hold it; the tree."""
    if dissem is None:
        return {"mode": "direct", "members": 0, "versions": [], "tree": []}
    cfg = getattr(dissem, "cfg", None)
    have = getattr(dissem, "have", None) or {}
    started = getattr(dissem, "started_at", None) or {}
    versions = []
    for v in sorted(have, reverse=True)[:DISSEM_VERSIONS_SHOWN]:
        t0 = started.get(v)
        deliveries = {}
        for peer, report in sorted(have[v].items()):
            done = getattr(report, "completed_at", None)
            deliveries[short(peer)] = {
                "seconds": round(done - t0, 3) if (done is not None and t0 is not None) else None,
                "pushed": getattr(report, "pushed", 0),
                "repaired": getattr(report, "repaired", 0),
                "rejected": getattr(report, "rejected", 0),
            }
        secs = [d["seconds"] for d in deliveries.values() if d["seconds"] is not None]
        versions.append({"version": v, "started_at": t0, "deliveries": deliveries,
                         "last_s": max(secs) if secs else None})
    plan_entry = getattr(dissem, "_plan", None)
    plan = plan_entry[1] if plan_entry else None
    tree = [_tree(trees) for trees in getattr(plan, "roots", [])] if plan is not None else []
    return {
        "mode": getattr(cfg, "mode", "?"),
        "codec": getattr(cfg, "codec", "?"),
        "fan_out": getattr(cfg, "fan_out", None),
        "members": len(getattr(dissem, "members", None) or {}),
        "depth": plan.depth() if plan is not None else 0,
        "versions": versions,
        "tree": tree,
    }


def ledger_from_counts(counts: dict[str, int], active_leases: int = 0) -> dict:
    """Groups per ledger state (``Coordinator.counts()`` or ``ledger.json``), drops split by reason."""
    dropped = {k.split(":", 1)[1]: v for k, v in counts.items() if k.startswith("dropped:")}
    out: dict[str, Any] = {s: counts.get(s, 0) for s in ("pending", "leased", "held", "completed", "trained")}
    out["dropped"] = dict(sorted(dropped.items()))
    out["dropped_total"] = sum(dropped.values())
    out["total"] = sum(counts.values())
    out["active_leases"] = active_leases
    return out


def ledger_view(coord) -> dict:
    """Prompt groups per state, read from the coordinator's ledger itself."""
    counts: dict[str, int] = {}
    for state in coord.ledger.values():
        counts[state] = counts.get(state, 0) + 1
    return ledger_from_counts(counts, len(getattr(coord, "leases", {}) or {}))


def status_view(src: DashboardSource, steps: list[dict], n_nodes: int, now_wall: float) -> dict:
    cfg, service, state = src.cfg, src.service, src.state
    last = steps[-1] if steps else {}
    if getattr(service, "done", False):
        phase = "done"
    elif n_nodes == 0:
        phase = "waiting for nodes"
    else:
        phase = "training"
    return {
        "run_id": getattr(service, "run_id", ""),
        "run_dir": src.run_dir,
        "phase": phase,
        "model": cfg.model.name,
        "task": cfg.task.name,
        "mode": cfg.sync.mode,
        "max_staleness": cfg.sync.max_staleness if cfg.sync.mode == "async" else 0,
        "step": getattr(state, "step", 0),
        "steps": cfg.train.steps,
        "version": getattr(state, "version", 0),
        "nodes": n_nodes,
        "uptime_s": round(now_wall - src.started_at, 1),
        "reward_mean": last.get("reward_mean"),
        "reward_rolling": last.get("reward_rolling"),
        "rolling_window": ROLLING_WINDOW,
        "samples_per_s": last.get("samples_per_s"),
        "samples": sum(s.get("samples", 0) for s in steps),
        "prompts_per_step": cfg.train.prompts_per_step,
        "group_size": cfg.train.group_size,
        "dissem_mode": cfg.dissem.mode,
    }


def snapshot(src: DashboardSource, now_wall: float | None = None) -> dict:
    """Everything the dashboard shows, as one JSON-ready dict."""
    service = src.service
    steps = list(src.steps.update(src.metrics.rows))
    nodes = nodes_view(service, src.clock())
    return {
        "status": status_view(src, steps, len(nodes), time.time() if now_wall is None else now_wall),
        "steps": steps,
        "nodes": nodes,
        "dissem": dissem_view(getattr(service, "dissem", None)),
        "ledger": ledger_view(service.coordinator),
    }


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (strict JSON has no NaN/inf)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
