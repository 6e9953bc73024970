"""Sequential vs async (S = 1, 2, 4 ...) on the same task, seed and sample budget, in one run.

Each mode runs the real system (``swarm-learner demo``: an in-process learner and N
``swarm-node`` processes over libp2p on 127.0.0.1) for the same number of learner steps, so
every run trains on the same number of samples. Afterwards the final adapter of every run is
evaluated on the task's held-out split with the llama.cpp backend (greedy; accuracy with a
Wilson 95% interval). Outputs in ``--out``: one run dir per mode, ``convergence.png`` (reward
against samples and against wall-clock time for all runs), ``convergence.json`` and a
markdown table (also printed): final eval accuracy with its interval, samples/s, learner idle
fraction (time waiting for data / step time) and dropped groups.

The runs share this machine one after another; on a 2-core machine the nodes and the learner
compete for the same cores, which limits what overlap can gain here.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=10, help="learner steps per run (same sample budget for all)")
    p.add_argument("--nodes", type=int, default=2, help="swarm-node processes per run")
    p.add_argument("--staleness", default="1,2,4", help="comma-separated S values of the async runs")
    p.add_argument("--no-sequential", action="store_true", help="skip the sequential reference run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-n", type=int, default=64, help="held-out problems per final evaluation (0 = skip)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default runs/convergence-<time>)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override applied to every run (repeatable)")


def modes(args) -> list[tuple[str, list[str]]]:
    out = [] if args.no_sequential else [("sequential", ["sync.mode=sequential"])]
    for s in [int(x) for x in str(args.staleness).split(",") if x.strip()]:
        out.append((f"async-S{s}", ["sync.mode=async", f"sync.max_staleness={s}"]))
    return out


def run_summary(rows: list[dict]) -> dict:
    """Throughput and utilisation figures of one run from its metrics rows."""
    step_s = sum(r["step_time_s"] for r in rows)
    idle_s = sum(r.get("learner_idle_s", r.get("gen_wait_s", 0.0)) for r in rows)
    dropped: dict[str, int] = {}
    for r in rows:
        for k, v in r.get("dropped", {}).items():
            dropped[k] = dropped.get(k, 0) + v
    return {
        "steps": len(rows),
        "samples": sum(r["samples"] for r in rows),
        "wall_s": rows[-1]["wall_s"] if rows else 0.0,
        "samples_per_s": sum(r["samples"] for r in rows) / step_s if step_s else 0.0,
        "learner_idle_frac": idle_s / step_s if step_s else 0.0,
        "dropped": dropped,
        "last5_reward": sum(r["reward_mean"] for r in rows[-5:]) / max(1, len(rows[-5:])),
        "max_staleness_seen": max((r.get("staleness_max", 0) for r in rows), default=0),
    }


def table(results: dict[str, dict]) -> str:
    lines = ["| run | eval accuracy (95% CI) | last-5 train reward | samples/s | learner idle | dropped groups | max lag |",
             "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        ev = r.get("eval")
        acc = f"{ev['accuracy']:.3f} [{ev['ci_low']:.3f}, {ev['ci_high']:.3f}] (n={ev['n']})" if ev else "-"
        dropped = sum(r["dropped"].values())
        lines.append(f"| {name} | {acc} | {r['last5_reward']:.3f} | {r['samples_per_s']:.2f} | "
                     f"{100 * r['learner_idle_frac']:.0f}% | {dropped} | {r['max_staleness_seen']} |")
    return "\n".join(lines)


def plot(runs: dict[str, list[dict]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from learner.metrics import rolling_mean

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for name, rows in runs.items():
        samples, total = [], 0
        for r in rows:
            total += r["samples"]
            samples.append(total)
        reward = rolling_mean([r["reward_mean"] for r in rows], 3)
        a1.plot(samples, reward, "o-", ms=3, label=name)
        a2.plot([r["wall_s"] for r in rows], reward, "o-", ms=3, label=name)
    a1.set_xlabel("samples trained")
    a2.set_xlabel("wall-clock seconds")
    a1.set_ylabel("train reward (rolling mean of 3 steps)")
    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.set_ylim(-0.02, 1.02)
    a1.legend(loc="lower right")
    fig.suptitle("sequential vs async: same task, seed and sample budget")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def run(args) -> None:
    from learner.cli import validate
    from learner.config import LearnerConfig
    from learner.demo import run_demo
    from learner.eval import run_eval
    from learner.metrics import read_metrics
    from swarm.config import load_config

    out = args.out or Path("runs") / f"convergence-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    base = [f"task.seed={args.seed}", f"train.seed={args.seed}", f"train.steps={args.steps}", *args.overrides]
    runs: dict[str, list[dict]] = {}
    results: dict[str, dict] = {}
    for name, extra in modes(args):
        print(f"convergence: === {name} ({args.steps} steps, {args.nodes} nodes) ===", flush=True)
        cfg = validate(load_config(LearnerConfig, None, base + extra))
        run_dir = out / name
        run_demo(cfg, args.nodes, run_dir)
        rows = read_metrics(run_dir / "metrics.jsonl")
        if not rows:
            print(f"convergence: {name} produced no steps; skipped")
            continue
        runs[name] = rows
        results[name] = run_summary(rows)
        if args.eval_n > 0 and (run_dir / "adapter").exists():
            ev = run_eval(cfg, args.eval_n, run_dir / "adapter", console=lambda s: None)[-1]
            results[name]["eval"] = {"n": ev.n, "accuracy": ev.accuracy, "ci_low": ev.ci_low,
                                     "ci_high": ev.ci_high, "mean_reward": ev.mean_reward}
        (out / "convergence.json").write_text(json.dumps(results, indent=1))
    if not runs:
        print("convergence: nothing ran")
        return
    plot(runs, out / "convergence.png")
    text = table(results)
    (out / "convergence.md").write_text(text + "\n")
    print(text)
    print(f"convergence: plot {out / 'convergence.png'}, figures {out / 'convergence.json'}")
