"""Check the capacity model against a measured run of the real system.

Input: a learner run directory with

- ``metrics.jsonl``: one row per learner step with at least ``step``, ``wall_s``,
  ``step_time_s``, ``train_s``, ``learner_idle_s``, ``samples``, ``samples_per_s``,
  ``staleness_hist`` (lag -> samples) and ``dropped`` (reason -> groups);
- ``config.toml``: ``[train]`` prompts_per_step, group_size, max_tokens; ``[sync]`` mode,
  max_staleness;
- ``swarm.json``: ``{"nodes": {peer_id: {backend, device, tokens_per_s, groups, completions,
  gen_s, gen_tokens}}}``.

Measured over the steps after ``skip`` warm-up steps: utilisation ``sum train_s / sum
step_time_s`` (fraction of wall time in the optimizer step) and samples/s ``sum samples /
sum step_time_s``. Predicted by :func:`bench.capacity.model.evaluate` from the run's own
figures: one worker class per node with group latency ``gen_s / groups`` (its measured
throughput, contention with the learner included), ``T_train`` = mean ``train_s``, the
learner's other busy time per step = mean ``step_time_s - train_s - learner_idle_s``, the
run's staleness bound and mode, and a fixed dissemination delay (default 0: loopback).
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

from bench.capacity.model import Network, Prediction, WorkerClass, Workload, evaluate

#: The relative error the issue asks the prediction to stay within.
TOLERANCE = 0.15


@dataclass
class Validation:
    workload: Workload
    classes: list[WorkerClass]
    prediction: Prediction
    measured_utilisation: float
    measured_samples_per_s: float
    measured_staleness: dict[int, int]
    measured_dropped: dict[str, int]
    steps_used: int

    @property
    def util_error(self) -> float:
        return _rel(self.prediction.utilisation, self.measured_utilisation)

    @property
    def sps_error(self) -> float:
        return _rel(self.prediction.samples_per_s, self.measured_samples_per_s)


def _rel(pred: float, meas: float) -> float:
    return abs(pred - meas) / abs(meas) if meas else math.inf


def _num(row: dict, key: str, where: str) -> float:
    v = row.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise ValueError(f"{where}: field {key!r} missing or not a finite number")
    return float(v)


def validate_run(run_dir: str | Path, skip: int = 1, diss_s: float = 0.0) -> Validation:
    """Predicted vs measured for one run directory (``ValueError`` with the reason if it is unusable)."""
    d = Path(run_dir)
    try:
        rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]
        cfg = tomllib.loads((d / "config.toml").read_text())
        swarm = json.loads((d / "swarm.json").read_text())
    except (OSError, json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"{d}: cannot read the run: {e}") from e
    used = rows[skip:]
    if not used:
        raise ValueError(f"{d}: {len(rows)} step(s) in metrics.jsonl, none left after skipping {skip}")
    train = [_num(r, "train_s", f"metrics.jsonl step {r.get('step')}") for r in used]
    step = [_num(r, "step_time_s", f"metrics.jsonl step {r.get('step')}") for r in used]
    idle = [_num(r, "learner_idle_s", f"metrics.jsonl step {r.get('step')}") for r in used]
    samples = [_num(r, "samples", f"metrics.jsonl step {r.get('step')}") for r in used]
    stale: dict[int, int] = {}
    dropped: dict[str, int] = {}
    for r in used:
        for lag, n in (r.get("staleness_hist") or {}).items():
            stale[int(lag)] = stale.get(int(lag), 0) + int(n)
        for why, n in (r.get("dropped") or {}).items():
            dropped[str(why)] = dropped.get(str(why), 0) + int(n)
    tr, sy = cfg.get("train", {}), cfg.get("sync", {})
    mode = "sequential" if sy.get("mode", "sequential") == "sequential" else "async"
    overhead = max(0.0, sum(s - t - i for s, t, i in zip(step, train, idle)) / len(used))
    workload = Workload(prompts_per_step=int(tr["prompts_per_step"]), group_size=int(tr["group_size"]),
                        train_s=sum(train) / len(train), overhead_s=overhead,
                        staleness=int(sy.get("max_staleness", 0)), mode=mode)
    classes = []
    for peer, node in sorted((swarm.get("nodes") or {}).items()):
        groups, gen_s = node.get("groups", 0), node.get("gen_s", 0.0)
        if not groups or not gen_s or gen_s <= 0:
            continue  # a node that never finished a group adds no throughput
        down = 1.0 / diss_s if diss_s > 0 else math.inf
        classes.append(WorkerClass(name=f"{node.get('backend', '?')}:{peer[-6:]}", group_s=gen_s / groups,
                                   down_Bps=down))
    if not classes:
        raise ValueError(f"{d}: swarm.json has no node with finished groups")
    net = Network(adapter_bytes=1.0 if diss_s > 0 else 0.0, topology="star")
    pred = evaluate(workload, classes, [1] * len(classes), net)
    return Validation(workload=workload, classes=classes, prediction=pred,
                      measured_utilisation=sum(train) / sum(step), measured_samples_per_s=sum(samples) / sum(step),
                      measured_staleness=dict(sorted(stale.items())), measured_dropped=dropped, steps_used=len(used))


def report(v: Validation) -> str:
    """Human-readable comparison table."""
    w, p = v.workload, v.prediction
    lines = [f"run: {w.mode}, S={w.staleness}, {w.prompts_per_step} x {w.group_size} per step, "
             f"{v.steps_used} steps used; mean train_s {w.train_s:.2f} s, other learner time {w.overhead_s:.2f} s/step",
             "nodes: " + ", ".join(f"{c.name} {c.group_s:.2f} s/group" for c in v.classes),
             f"{'':22}{'predicted':>11}{'measured':>11}{'rel. error':>12}"]
    for label, a, b, e in (("learner utilisation", p.utilisation, v.measured_utilisation, v.util_error),
                           ("samples/s", p.samples_per_s, v.measured_samples_per_s, v.sps_error)):
        flag = "ok" if e <= TOLERANCE else f"> {TOLERANCE:.0%}"
        lines.append(f"{label:22}{a:11.3f}{b:11.3f}{e:11.1%}  {flag}")
    total = sum(v.measured_staleness.values())
    meas = {k: n / total for k, n in v.measured_staleness.items()} if total else {}
    lines.append("staleness (lag: predicted / measured): " + ", ".join(
        f"{k}: {p.staleness[k] if k < len(p.staleness) else 0.0:.2f} / {meas.get(k, 0.0):.2f}"
        for k in range(max(len(p.staleness), max(meas, default=-1) + 1))))
    if v.measured_dropped:
        lines.append("dropped groups (measured): " + ", ".join(f"{k} {n}" for k, n in v.measured_dropped.items()))
    lines.append(f"predicted wasted fraction of generated groups: {p.wasted:.2f}")
    return "\n".join(lines)
