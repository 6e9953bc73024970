"""The dashboard's views, the API and ``/metrics``: JSON-ready dicts made from the typed snapshots
the learner's parts publish (:meth:`learner.service.LearnerService.statistics`: the roster's nodes,
the coordinator's ledger, the dissemination's members and tree, the pipelines' stages, the work
ledger), never from their private state; a field a part does not have is a type error, not an empty
column. The functions over snapshots (:func:`steps_view`, :func:`nodes_view`, :func:`dissem_view`,
:func:`ledger_view`) are pure: same snapshot and clock in, same dict out. Taking a snapshot changes
nothing in the learner.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from learner.group_ledger import GroupState
from learner.ledger import work_columns
from learner.metrics import ROLLING_WINDOW

if TYPE_CHECKING:  # annotations only: the report reads this module without the learner's parts
    from learner.checkpoint import LoopState
    from learner.config import LearnerConfig
    from learner.dissem_report import DissemStats, TreeView
    from learner.group_ledger import LedgerStats
    from learner.service import ServiceStats

#: Per-step keys the dashboard keeps from a ``metrics.jsonl`` row (plus every ``eval_*`` key).
STEP_KEYS = ("step", "policy_version", "reward_mean", "samples", "samples_per_s", "learner_idle_s",
             "train_s", "step_time_s", "staleness_max", "wall_s", "clip_frac", "buffer_groups")
#: Versions of dissemination shown (newest first).
DISSEM_VERSIONS_SHOWN = 12
#: The ledger states the dashboard counts, in order (dropped groups are counted per reason).
LEDGER_STATES = tuple(s for s in GroupState if s is not GroupState.DROPPED)


class StatsSource(Protocol):
    """What the dashboard reads of the learner's service (:class:`~learner.service.LearnerService`)."""

    def statistics(self) -> ServiceStats: ...


class MetricRows(Protocol):
    """The metrics rows written so far (:class:`~learner.metrics.MetricsWriter`)."""

    @property
    def rows(self) -> Sequence[Mapping[str, Any]]: ...


@dataclass
class DashboardSource:
    """What the dashboard reads: the learner's service (through its snapshots) and the run's
    progress (never driven)."""

    #: The resolved config.
    cfg: LearnerConfig
    #: The service: every part's snapshot (:meth:`~learner.service.LearnerService.statistics`).
    service: StatsSource
    #: The metrics rows.
    metrics: MetricRows
    #: The loop's step and version.
    state: LoopState
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

    def update(self, rows: Sequence[Mapping[str, Any]]) -> list[dict]:
        if len(rows) < len(self.out):  # a shorter history (a resumed run): start over
            self.out, self._rewards = [], []
        for row in rows[len(self.out):]:
            self._rewards.append(float(row.get("reward_mean", 0.0)))
            window = self._rewards[-ROLLING_WINDOW:]
            kept = {k: row[k] for k in STEP_KEYS if k in row}
            kept.update({k: v for k, v in row.items() if k.startswith("eval_") and isinstance(v, (int, float))})
            kept["reward_rolling"] = round(sum(window) / len(window), 4)
            self.out.append(kept)
        return self.out


def steps_view(rows: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Per step: the kept keys of each row plus the rolling mean reward (as ``rolling_mean``)."""
    return StepsView().update(rows)


def nodes_view(stats: ServiceStats, now: float) -> list[dict]:
    """One dict per node that said hello: identity, hardware, speed, adapter held, contribution,
    trust, reachability, place in the broadcast and in the pipelines, checked work."""
    coord = stats.coordinator
    dissem = stats.dissem
    held: dict[str, int] = {p: w.newest_version for p, w in coord.peers.items()}
    for delivered in dissem.versions if dissem is not None else ():
        for d in delivered.deliveries:
            held[d.peer_id] = max(held.get(d.peer_id, -1), delivered.version)
    out = []
    for n in stats.roster.nodes:
        peer = n.peer_id
        work = coord.peers.get(peer)
        version = held.get(peer)
        speed = n.tokens_per_s
        row: dict[str, Any] = {
            "peer_id": peer,
            "short": short(peer),
            "name": n.name,
            "backend": n.backend,
            "device": n.device,
            "memory_gib": round(n.memory_bytes / 2**30, 2),
            "announced_tokens_per_s": round(n.announced_tokens_per_s, 1),
            "tokens_per_s": round(speed, 1) if speed is not None else None,
            "adapter_version": version,
            "lag": coord.version - version if version is not None else None,
            "push_staleness": (coord.version - work.oldest_untrained
                               if work is not None and work.oldest_untrained is not None else None),
            "rollouts": n.completions_pushed,
            "groups": n.groups_pushed,
            "rejected_groups": n.rejected_groups,
            "leased_groups": work.leased_groups if work is not None else 0,
            "last_seen_s": round(max(0.0, now - n.last_seen), 1),
            "trusted": "yes" if n.trusted else f"no: {n.untrusted_reason}",
            "stage": stats.stages.get(peer),
        }
        member = dissem.members.get(peer) if dissem is not None else None
        row["in_broadcast"] = member is not None
        if member is not None:
            row["reachable"] = "yes" if member.reachable else "no"
            if member.leaf is not None:
                row["leaf"] = "yes" if member.leaf else "no (relays)"
            if member.link:  # relay or leaf by its links, and why (swarm/discovery/links.py)
                row["link"], row["link_why"] = member.link, member.link_why
        row.update(work_columns(stats.work.get(peer)))  # the work ledger: trained, verified by which test
        out.append(row)
    return out


def _tree(t: TreeView) -> dict:
    return {"peer": short(t.peer_id), "children": [_tree(c) for c in t.children]}


def dissem_view(dissem: DissemStats | None) -> dict:
    """Per version: when its broadcast started and how long each node took to hold it; the tree."""
    if dissem is None:
        return {"mode": "direct", "members": 0, "versions": [], "tree": [], "depth": 0}
    versions = []
    for v in dissem.versions[:DISSEM_VERSIONS_SHOWN]:
        t0 = v.started_at
        deliveries = {short(d.peer_id): {"seconds": round(d.completed_at - t0, 3) if t0 is not None else None,
                                         "pushed": d.pushed, "repaired": d.repaired, "rejected": d.rejected}
                      for d in v.deliveries}
        secs = [d["seconds"] for d in deliveries.values() if d["seconds"] is not None]
        versions.append({"version": v.version, "started_at": t0, "deliveries": deliveries,
                         "last_s": max(secs) if secs else None})
    return {
        "mode": dissem.mode,
        "codec": dissem.codec,
        "fan_out": dissem.fan_out,
        "members": len(dissem.members),
        "depth": dissem.depth,
        "versions": versions,
        "tree": [[_tree(t) for t in stripe] for stripe in dissem.tree],
    }


def ledger_from_counts(counts: Mapping[str, int], active_leases: int = 0) -> dict:
    """Groups per ledger state (``ledger.json``'s counts: dropped ones as ``dropped:<reason>``),
    drops split by reason."""
    dropped = {k.split(":", 1)[1]: v for k, v in counts.items() if k.startswith("dropped:")}
    out: dict[str, Any] = {str(s): counts.get(s, 0) for s in LEDGER_STATES}
    out["dropped"] = dict(sorted(dropped.items()))
    out["dropped_total"] = sum(dropped.values())
    out["total"] = sum(counts.values())
    out["active_leases"] = active_leases
    return out


def ledger_view(ledger: LedgerStats) -> dict:
    """Prompt groups per state, from the coordinator's ledger snapshot."""
    return ledger_from_counts(ledger.counts(), ledger.active_leases)


def status_view(src: DashboardSource, stats: ServiceStats, steps: list[dict], now_wall: float) -> dict:
    cfg, state = src.cfg, src.state
    last = steps[-1] if steps else {}
    if stats.done:
        phase = "done"
    elif stats.roster.members == 0:
        phase = "waiting for nodes"
    else:
        phase = "training"
    return {
        "run_id": stats.run_id,
        "run_dir": src.run_dir,
        "phase": phase,
        "model": cfg.model.name,
        "task": cfg.task.name,
        "mode": cfg.sync.mode,
        "max_staleness": cfg.sync.max_staleness if cfg.sync.mode == "async" else 0,
        "step": state.step,
        "steps": cfg.train.steps,
        "version": state.version,
        "nodes": stats.roster.members,
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
    stats = src.service.statistics()
    steps = list(src.steps.update(src.metrics.rows))
    return {
        "status": status_view(src, stats, steps, time.time() if now_wall is None else now_wall),
        "steps": steps,
        "nodes": nodes_view(stats, src.clock()),
        "dissem": dissem_view(stats.dissem),
        "ledger": ledger_view(stats.coordinator.ledger),
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
