"""PNG plots of the capacity model: utilisation vs number of workers, cost vs utilisation."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Sequence

from bench.capacity.model import Network, WorkerClass, Workload, evaluate
from bench.capacity.provision import cheapest


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def util_vs_workers(workload: Workload, worker: WorkerClass, net: Network, staleness: Sequence[int],
                    max_workers: int, path: Path) -> Path:
    """Utilisation against the number of nodes of one class, one line per staleness bound
    (and the sequential schedule for reference)."""
    plt = _plt()
    ns = sorted({max(1, round(max_workers * i / 60)) for i in range(61)})
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for S in staleness:
        w = replace(workload, staleness=S, mode="async")
        ax.plot(ns, [evaluate(w, [worker], [n], net).utilisation for n in ns], label=f"async, S={S}")
    ws = replace(workload, mode="sequential", staleness=0)
    ax.plot(ns, [evaluate(ws, [worker], [n], net).utilisation for n in ns], "k--", label="sequential")
    ax.set_xlabel(f"nodes ({worker.name}, {worker.group_s:.1f} s per group)")
    ax.set_ylabel("learner utilisation")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"{workload.prompts_per_step} x {workload.group_size} per step, T_train {workload.train_s:.1f} s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def cost_vs_util(workload: Workload, classes: Sequence[WorkerClass], net: Network, staleness: Sequence[int],
                 path: Path, targets: Sequence[float] = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)) -> Path:
    """Cost per 1,000 samples of the cheapest mix against the target utilisation, per staleness bound."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for S in staleness:
        w = replace(workload, staleness=S, mode="async")
        xs, ys = [], []
        for t in targets:
            plan = cheapest(w, classes, t, net)
            if plan is not None:
                xs.append(plan.prediction.utilisation)
                ys.append(plan.prediction.cost_per_1k_samples)
        ax.plot(xs, ys, "o-", label=f"S={S}")
    ax.set_xlabel("learner utilisation of the cheapest mix")
    ax.set_ylabel("cost per 1,000 samples")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("cheapest mix per target utilisation")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
