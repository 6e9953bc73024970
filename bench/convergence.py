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
compete for the same cores, which limits what overlap can gain here. ``--pin-cores`` gives
each side its own cores (``bench/affinity.py``: the learner on the first, torch threads = its
cores; the nodes on the rest, llama.cpp threads = their cores / nodes), so async overlap is
real. ``--eval-every k`` keeps the adapter of every k-th step (``bench/snapshots.py``) and
scores the async runs' adapters on the held-out split in step order until one reaches the
sequential run's final accuracy: the time to that accuracy, its ratio to the sequential run's
wall-clock and a goal line (issue goal: <= 0.75x with the learner idle under 10%) are printed
and written to ``overlap.json`` / ``overlap.md``. ``--async-steps`` lets the async runs go on
longer than the sequential one (the clock stops where they reach its accuracy).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

#: Issue goal: async reaches the sequential run's held-out accuracy within this share of its wall-clock ...
GOAL_TIME_RATIO = 0.75
#: ... with the learner waiting for data less than this share of its step time.
GOAL_IDLE_FRAC = 0.10


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=10, help="learner steps per run (same sample budget for all)")
    p.add_argument("--nodes", type=int, default=2, help="swarm-node processes per run")
    p.add_argument("--staleness", default="1,2,4", help="comma-separated S values of the async runs")
    p.add_argument("--no-sequential", action="store_true", help="skip the sequential reference run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-n", type=int, default=64, help="held-out problems per final evaluation (0 = skip)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default runs/convergence-<time>)")
    p.add_argument("--pin-cores", action="store_true",
                   help="learner on its own core(s), nodes on the others (CPU affinity; threads sized to the cores)")
    p.add_argument("--learner-cores", type=int, default=1, help="with --pin-cores: CPUs for the learner (the lowest ones)")
    p.add_argument("--async-steps", type=int, default=0, help="learner steps of the async runs (0 = --steps)")
    p.add_argument("--eval-every", type=int, default=0,
                   help="keep every k-th step's adapter and score the async runs' ones for time to accuracy (0 = final only)")
    p.add_argument("--eval-workers", type=int, default=2, help="held-out evaluations side by side (processes)")
    p.add_argument("--eval-threads", type=int, default=0,
                   help="llama.cpp threads per evaluation (0 = 1 with several workers, else all cores)")
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


def step_profile(rows: list[dict]) -> dict:
    """Mean seconds per step after the first (which includes the nodes' start): waiting for data,
    the GRPO update, and the rest (reward scoring, adapter export and publish, bookkeeping)."""
    body = rows[1:] or rows
    if not body:
        return {"step_s": 0.0, "idle_s": 0.0, "train_s": 0.0, "other_s": 0.0, "idle_frac": 0.0}
    mean = lambda key: sum(r.get(key, 0.0) for r in body) / len(body)  # noqa: E731
    step, idle, train = mean("step_time_s"), mean("learner_idle_s"), mean("train_s")
    return {"step_s": step, "idle_s": idle, "train_s": train, "other_s": max(0.0, step - idle - train),
            "idle_frac": idle / step if step else 0.0}


def time_to_accuracy(series: list[dict], target: float) -> dict | None:
    """First point of ``series`` (``step``, ``wall_s``, ``accuracy``; any order) whose held-out
    accuracy reaches ``target``; None if none does."""
    for point in sorted(series, key=lambda e: e["step"]):
        if point["accuracy"] >= target - 1e-9:
            return point
    return None


def goal_line(name: str, seq_wall_s: float, reach: dict | None, idle_frac: float, target: float,
              max_ratio: float = GOAL_TIME_RATIO, max_idle: float = GOAL_IDLE_FRAC) -> str:
    """One line: is the goal (reach ``target`` within ``max_ratio`` x the sequential wall-clock,
    learner idle under ``max_idle``) met, and by how much. ``idle_frac``: the steady state (steps
    after the first, whose wait includes the nodes' start-up; ``step_profile``)."""
    idle = (f"learner idle {100 * idle_frac:.1f}% (goal < {100 * max_idle:.0f}%: "
            f"{'met' if idle_frac < max_idle else 'missed'} by {100 * abs(max_idle - idle_frac):.1f} points)")
    if reach is None:
        return (f"goal NOT MET for {name}: never reached the sequential accuracy {target:.3f} within its run; "
                f"{idle}")
    ratio = reach["wall_s"] / seq_wall_s if seq_wall_s > 0 else float("inf")
    time_ok = ratio <= max_ratio
    verdict = "MET" if time_ok and idle_frac < max_idle else "NOT MET"
    return (f"goal {verdict} for {name}: reached {target:.3f} at step {reach['step']}, {reach['wall_s']:.0f}s = "
            f"{ratio:.2f}x the sequential {seq_wall_s:.0f}s (goal <= {max_ratio:.2f}x: "
            f"{'met' if time_ok else 'missed'} by {abs(max_ratio - ratio):.2f}); {idle}")


def overlap_table(results: dict[str, dict], seq_wall_s: float, target: float | None) -> str:
    lines = ["| run | steps | wall-clock | held-out accuracy (final) | time to sequential accuracy | ratio | "
             "learner idle (all steps / after step 1) | samples/s | per step after step 1: wait / train / other |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        ev, reach, pr = r.get("eval"), r.get("reach"), r["profile"]
        acc = f"{ev['accuracy']:.3f} [{ev['ci_low']:.3f}, {ev['ci_high']:.3f}]" if ev else "-"
        if name == "sequential":
            when, ratio = f"{r['wall_s']:.0f}s (its own end)", "1.00"
        elif reach:
            when, ratio = f"{reach['wall_s']:.0f}s (step {reach['step']})", f"{reach['wall_s'] / seq_wall_s:.2f}"
        else:
            when, ratio = ("not reached" if target is not None else "-"), "-"
        lines.append(f"| {name} | {r['steps']} | {r['wall_s']:.0f}s | {acc} | {when} | {ratio} | "
                     f"{100 * r['learner_idle_frac']:.1f}% / {100 * pr['idle_frac']:.1f}% | {r['samples_per_s']:.2f} | "
                     f"{pr['idle_s']:.1f} / {pr['train_s']:.1f} / {pr['other_s']:.1f} s |")
    return "\n".join(lines)


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


def _eval_dict(ev) -> dict:
    return {"n": ev.n, "correct": ev.correct, "accuracy": ev.accuracy, "ci_low": ev.ci_low,
            "ci_high": ev.ci_high, "mean_reward": ev.mean_reward, "seconds": round(ev.seconds, 1)}


def _series_eval(cfg, args, name: str, run_dir: Path, rows: list[dict], target: float | None) -> list[dict]:
    """Score the run's kept adapters in step order; once one reaches ``target`` only the one at
    the sequential run's step count and the final one are still scored."""
    from bench.snapshots import adapter_dir_from_snapshot, eval_parallel, snapshot_steps

    wall = {r["step"]: r["wall_s"] for r in rows}
    dirs = []
    for step, snap in snapshot_steps(run_dir / "snapshots").items():
        if step in wall:
            dirs.append((step, adapter_dir_from_snapshot(snap, run_dir / "adapter" / "adapter_config.json",
                                                         run_dir / "snapshots" / f"adapter_{step}")))
    keep = {args.steps, rows[-1]["step"]}

    def want(label: str, done: dict) -> bool:
        reached = target is not None and any(r.accuracy >= target - 1e-9 for r in done.values())
        return not reached or int(label.rsplit("@", 1)[1]) in keep

    evals = eval_parallel(cfg, args.eval_n, [(f"{name}@{step}", d) for step, d in dirs], args.eval_workers,
                          threads=args.eval_threads or None, want=want)
    return [{"step": int(label.rsplit("@", 1)[1]), "wall_s": wall[int(label.rsplit("@", 1)[1])], **_eval_dict(ev)}
            for label, ev in evals.items()]


def run(args) -> None:
    plan = everything = None
    if args.pin_cores:  # before torch or llama.cpp make any thread
        from bench.affinity import available_cpus, pin_process, plan_cores

        everything = available_cpus()
        plan = plan_cores(everything, args.learner_cores)
        if args.nodes > len(plan.nodes):
            print(f"convergence: warning: {args.nodes} nodes on {len(plan.nodes)} core(s) oversubscribe them")
        print(f"convergence: learner on CPU {sorted(plan.learner)} ({plan.learner_threads()} torch thread(s)), "
              f"{args.nodes} node(s) on CPU {sorted(plan.nodes)} ({plan.node_threads(args.nodes)} llama.cpp "
              f"thread(s) each)", flush=True)

    from bench.snapshots import SnapshotWatcher, eval_parallel
    from learner.cli import validate
    from learner.config import LearnerConfig
    from learner.demo import run_demo
    from learner.metrics import read_metrics
    from swarm.config import load_config

    out = args.out or Path("runs") / f"convergence-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    base = [f"task.seed={args.seed}", f"train.seed={args.seed}"]
    if plan:
        base.append(f"train.torch_threads={plan.learner_threads()}")
    if args.eval_every:
        base.append(f"train.checkpoint_every={args.eval_every}")
    base += args.overrides
    runs: dict[str, list[dict]] = {}
    results: dict[str, dict] = {}
    base_eval = None
    for name, extra in modes(args):
        steps = args.steps if name == "sequential" else (args.async_steps or args.steps)
        print(f"convergence: === {name} ({steps} steps, {args.nodes} nodes) ===", flush=True)
        cfg = validate(load_config(LearnerConfig, None, base + [f"train.steps={steps}"] + extra))
        run_dir = out / name
        watch = SnapshotWatcher(run_dir, run_dir / "snapshots") if args.eval_every else contextlib.nullcontext()
        if plan:
            pin_process(plan.learner)
        try:
            with watch:
                run_demo(cfg, args.nodes, run_dir, node_cpus=set(plan.nodes) if plan else None)
        finally:
            if plan:
                pin_process(everything)  # evaluation is not timed: it may use every core
        rows = read_metrics(run_dir / "metrics.jsonl")
        if not rows:
            print(f"convergence: {name} produced no steps; skipped")
            continue
        runs[name] = rows
        results[name] = r = run_summary(rows)
        r["profile"] = step_profile(rows)
        if args.eval_n > 0 and (run_dir / "adapter").exists():
            seq = results.get("sequential", {}).get("eval")
            if name == "sequential" or not args.eval_every:
                todo = ([("base", None)] if base_eval is None else []) + [(name, run_dir / "adapter")]
                evals = eval_parallel(cfg, args.eval_n, todo, args.eval_workers, threads=args.eval_threads or None)
                base_eval = _eval_dict(evals["base"]) if "base" in evals else base_eval
                r["eval"] = _eval_dict(evals[name])
            else:
                r["series"] = _series_eval(cfg, args, name, run_dir, rows, seq["accuracy"] if seq else None)
                if r["series"]:
                    r["eval"] = max(r["series"], key=lambda e: e["step"])
                if seq:
                    r["reach"] = time_to_accuracy(r["series"], seq["accuracy"])
        (out / "convergence.json").write_text(json.dumps(results, indent=1))
    if not runs:
        print("convergence: nothing ran")
        return
    plot(runs, out / "convergence.png")
    text = table(results)
    (out / "convergence.md").write_text(text + "\n")
    print(text)
    seq = results.get("sequential")
    if seq and seq.get("eval") and args.eval_every:
        target, seq_wall = seq["eval"]["accuracy"], seq["wall_s"]
        lines = [overlap_table(results, seq_wall, target), ""]
        if base_eval:
            lines.append(f"base model held-out accuracy {base_eval['accuracy']:.3f} (n={base_eval['n']}); "
                         f"target = sequential final {target:.3f} (n={seq['eval']['n']})")
        for name, r in results.items():
            if name != "sequential":
                lines.append(goal_line(name, seq_wall, r.get("reach"), r["profile"]["idle_frac"], target))
                acc_at = {e["step"]: e["accuracy"] for e in r.get("series", [])}
                if args.steps in acc_at:
                    lines.append(f"{name}: held-out accuracy at step {args.steps} (the sequential budget) "
                                 f"{acc_at[args.steps]:.3f}")
        (out / "overlap.md").write_text("\n".join(lines) + "\n")
        (out / "overlap.json").write_text(json.dumps({"pinned": bool(plan), "base_eval": base_eval, "target": target,
                                                      "sequential_wall_s": seq_wall, "lines": lines[2:]}, indent=1))
        print("\n".join(lines))
    print(f"convergence: plot {out / 'convergence.png'}, figures {out / 'convergence.json'}")
