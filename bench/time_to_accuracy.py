"""Time to accuracy, the swarm against TRL: ``swarm-bench colocated --baseline trl``.

One command, one machine, one arm after the other:

1. the swarm: ``swarm-learner demo`` (``learner.demo.run_demo``: an in-process learner and
   ``--nodes`` ``swarm-node`` processes over libp2p on 127.0.0.1) with the learner config;
2. TRL's ``GRPOTrainer`` with a peft LoRA on the same task, model, prompts and settings
   (``bench/trl_baseline.py``), its wall-clock capped at ``--trl-cap-factor`` times the
   swarm's time to the target (at least the swarm's whole run, so an equal-time adapter
   exists), or at ``--trl-max-s``, and never past ``--trl-end-by``;
3. held-out evaluation as ``swarm-learner eval`` does it (llama.cpp, greedy,
   ``bench.snapshots.eval_parallel``: ``--eval-workers`` single-threaded processes side by
   side) of the base model (once), the swarm's final adapter, TRL's adapter at the swarm's
   wall-clock and TRL's final adapter on the same ``--eval-n`` held-out problems.

Reported (printed as a markdown table, written to ``tta.json`` / ``tta.md`` in ``--out``):
wall-clock and samples to the first rolling-5 mean reward >= ``--target`` for each arm, and
held-out accuracy (Wilson 95% interval) at equal wall-clock, with the goal line of the issue:
the swarm reaches the target in at most a third of TRL's wall-clock, with held-out accuracy no
lower. When TRL does not reach the target within its cap, the ratio is an upper bound
(swarm time / TRL's whole time), which decides the goal when it is already <= 1/3.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

#: Issue goal: the swarm reaches the target in at most this share of TRL's wall-clock (and its
#: held-out accuracy at equal wall-clock is no lower than TRL's).
GOAL_SPEED_RATIO = 1 / 3
#: TRL's default wall-clock cap, in multiples of the swarm's time to the target: enough to
#: decide the speed goal either way (TRL not there by then means a ratio of at most 1/3).
DEFAULT_CAP_FACTOR = 3.0


def add_trl_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--baseline trl")
    g.add_argument("--nodes", type=int, default=2, help="swarm-node processes of the swarm arm")
    g.add_argument("--trl-cap-factor", type=float, default=DEFAULT_CAP_FACTOR,
                   help="TRL's wall-clock cap as a multiple of the swarm's time to the target")
    g.add_argument("--trl-max-s", type=float, default=0.0, help="fixed wall-clock cap of TRL in seconds (overrides the factor)")
    g.add_argument("--trl-end-by", default="", metavar="HH:MM",
                   help="local time by which TRL stops at the latest (a shared machine's slot); the cap shrinks to fit")
    g.add_argument("--trl-steps", type=int, default=0, help="most TRL steps (generation batches); 0 = 3x --steps")
    g.add_argument("--eval-n", type=int, default=200, help="held-out problems per evaluation (0 = skip)")
    g.add_argument("--no-eval-trl-final", action="store_true",
                   help="score only TRL's equal-time adapter, not also its final one")
    g.add_argument("--eval-workers", type=int, default=2,
                   help="held-out evaluations side by side (processes, 1 llama.cpp thread each); 1 = one after another")


# -- pure decisions ------------------------------------------------------------------------------
def trl_cap_s(swarm_hit_s: float | None, swarm_wall_s: float, factor: float = DEFAULT_CAP_FACTOR,
              fixed_s: float = 0.0, limit_s: float | None = None) -> float:
    """TRL's wall-clock cap: ``fixed_s`` when given, else ``factor`` x the swarm's time to the target
    (its whole run when it never got there), and never less than the swarm's whole run; then at
    most ``limit_s`` (the time left before ``--trl-end-by``), and at least 1 s."""
    if fixed_s > 0:
        cap = float(fixed_s)
    else:
        base = swarm_hit_s if swarm_hit_s is not None else swarm_wall_s
        cap = max(factor * base, swarm_wall_s)
    return max(1.0, min(cap, limit_s) if limit_s is not None else cap)


def seconds_until(hhmm: str, now: float) -> float | None:
    """Seconds from ``now`` (epoch) to the next local ``HH:MM``; None for an empty string."""
    if not hhmm:
        return None
    try:
        hour, minute = (int(x) for x in hhmm.split(":"))
        lt = time.localtime(now)
        target = time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, hour, minute, 0, 0, 0, -1))
    except (ValueError, OverflowError):
        raise ValueError(f"--trl-end-by: expected HH:MM, got {hhmm!r}") from None
    return target - now if target > now else target + 86400 - now


def arm_figures(rows: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """Steps, wall-clock, samples, best rolling-5 reward and the first crossing of ``target``."""
    from learner.metrics import first_reaching, rolling_mean

    rolled = rolling_mean([r["reward_mean"] for r in rows])
    return {"steps": len(rows), "wall_s": rows[-1]["wall_s"] if rows else 0.0,
            "samples": sum(r["samples"] for r in rows), "best_rolling": max(rolled, default=0.0),
            "hit": first_reaching(rows, target) if rows else None}


def speed_verdict(swarm: dict, trl: dict, target: float, goal: float = GOAL_SPEED_RATIO) -> dict[str, Any]:
    """Ratio of the swarm's time to ``target`` to TRL's: exact when both got there, an upper bound
    when only the swarm did. ``met`` is None when the figures cannot decide the goal."""
    if swarm["hit"] is None:
        return {"ratio": None, "bound": False, "met": False,
                "text": f"the swarm did not reach {target} (best rolling mean {swarm['best_rolling']:.3f})"}
    s = swarm["hit"]["wall_s"]
    if trl["hit"] is not None:
        ratio = s / trl["hit"]["wall_s"] if trl["hit"]["wall_s"] > 0 else float("inf")
        return {"ratio": ratio, "bound": False, "met": ratio <= goal,
                "text": f"swarm {s:.0f} s vs TRL {trl['hit']['wall_s']:.0f} s to {target}: ratio {ratio:.2f}"}
    bound = s / trl["wall_s"] if trl["wall_s"] > 0 else float("inf")
    return {"ratio": bound, "bound": True, "met": True if bound <= goal else None,
            "text": (f"TRL did not reach {target} in {trl['wall_s']:.0f} s (best rolling mean "
                     f"{trl['best_rolling']:.3f}), so the ratio is at most {bound:.2f} (swarm {s:.0f} s)")}


def accuracy_verdict(swarm_eval: dict | None, trl_eval: dict | None) -> dict[str, Any]:
    """Held-out accuracy of the swarm vs TRL at equal wall-clock: met when no lower."""
    if not swarm_eval or not trl_eval:
        return {"met": None, "text": "held-out accuracy not measured"}
    a, b = swarm_eval["accuracy"], trl_eval["accuracy"]
    overlap = swarm_eval["ci_low"] <= trl_eval["ci_high"] and trl_eval["ci_low"] <= swarm_eval["ci_high"]
    return {"met": a >= b, "difference": a - b,
            "text": (f"held-out accuracy swarm {a:.3f} vs TRL {b:.3f} at equal wall-clock "
                     f"({'+' if a >= b else ''}{a - b:.3f}; 95% intervals {'overlap' if overlap else 'do not overlap'})")}


def goal_line(speed: dict, accuracy: dict) -> str:
    met = (False if speed["met"] is False or accuracy["met"] is False
           else None if speed["met"] is None or accuracy["met"] is None else True)
    word = {True: "MET", False: "NOT MET", None: "UNDECIDED"}[met]
    return (f"Goal (swarm reaches the target in <= 1/3 of TRL's wall-clock, held-out accuracy no lower): "
            f"{word}. Speed: {speed['text']}. Accuracy: {accuracy['text']}.")


def _acc(e: dict | None) -> str:
    return f"{e['accuracy']:.3f} [{e['ci_low']:.3f}, {e['ci_high']:.3f}] (n={e['n']})" if e else "-"


def markdown_table(swarm: dict, trl: dict, evals: dict[str, dict], target: float, trl_equal_s: float | None) -> str:
    def hit(a: dict, key: str, fmt: str) -> str:
        return format(a["hit"][key], fmt) if a["hit"] else f"not reached (best {a['best_rolling']:.3f})"

    lines = [f"| arm | steps | samples | wall-clock (s) | time to rolling {target} (s) | samples to {target} "
             f"| held-out accuracy at equal wall-clock (95% CI) |", "|---|---|---|---|---|---|---|"]
    lines.append(f"| swarm | {swarm['steps']} | {swarm['samples']} | {swarm['wall_s']:.0f} | {hit(swarm, 'wall_s', '.0f')} "
                 f"| {hit(swarm, 'samples', 'd')} | {_acc(evals.get('swarm'))} |")
    equal = f" (adapter at {trl_equal_s:.0f} s)" if trl_equal_s is not None else ""
    lines.append(f"| TRL GRPOTrainer | {trl['steps']} | {trl['samples']} | {trl['wall_s']:.0f} | {hit(trl, 'wall_s', '.0f')} "
                 f"| {hit(trl, 'samples', 'd')} | {_acc(evals.get('trl-equal'))}{equal} |")
    extra = [f"base model: {_acc(evals.get('base'))}"] if evals.get("base") else []
    if evals.get("trl-final"):
        extra.append(f"TRL at its end ({trl['wall_s']:.0f} s): {_acc(evals['trl-final'])}")
    return "\n".join(lines + ([""] + ["; ".join(extra)] if extra else []))


# -- the run -------------------------------------------------------------------------------------
def run_vs_trl(args) -> int:
    from dataclasses import asdict

    from bench.trl_baseline import EQUAL_ADAPTER, FINAL_ADAPTER, run_trl
    from learner.cli import validate
    from learner.config import LearnerConfig
    from learner.demo import run_demo
    from bench.snapshots import eval_parallel
    from learner.metrics import read_metrics
    from learner.models import resolve_model
    from swarm.config import load_config

    overrides = [f"task.seed={args.seed}", f"train.seed={args.seed}", f"train.steps={args.steps}", *args.overrides]

    def config():
        return validate(load_config(LearnerConfig, args.config, overrides))

    seconds_until(args.trl_end_by, time.time())  # a bad value fails before the swarm runs
    out = Path(args.out or Path("runs") / f"tta-trl-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    print(f"time to accuracy: swarm ({args.nodes} nodes) then TRL; out {out}", flush=True)
    run_demo(config(), args.nodes, out / "swarm")
    swarm = arm_figures(read_metrics(out / "swarm" / "metrics.jsonl"), args.target)
    if not swarm["steps"]:
        print("time to accuracy: the swarm completed no step")
        return 1
    cap = trl_cap_s(swarm["hit"]["wall_s"] if swarm["hit"] else None, swarm["wall_s"], args.trl_cap_factor,
                    args.trl_max_s, seconds_until(args.trl_end_by, time.time()))
    cfg = config()
    resolved = resolve_model(cfg.model.name, cfg.model.cache_dir or None, cfg.model.revision)
    trl_summary = run_trl(cfg, resolved.hf_dir, out / "trl", max_steps=args.trl_steps or 3 * cfg.train.steps,
                          threads=args.threads, equal_wall_s=swarm["wall_s"], max_wall_s=cap)
    trl = arm_figures(read_metrics(out / "trl" / "metrics.jsonl"), args.target)
    equal_s = json.loads((out / "trl" / EQUAL_ADAPTER / "wall_s.json").read_text())["wall_s"]
    evals: dict[str, dict] = {}
    if args.eval_n > 0:  # the base model once, then each adapter; side by side on the cores
        arms = [("base", None), ("swarm", out / "swarm" / "adapter"), ("trl-equal", out / "trl" / EQUAL_ADAPTER)]
        arms += [] if args.no_eval_trl_final else [("trl-final", out / "trl" / FINAL_ADAPTER)]
        print(f"time to accuracy: held-out evaluation of {', '.join(a for a, _ in arms)} on {args.eval_n} problems "
              f"({max(1, args.eval_workers)} at a time)", flush=True)
        scored = eval_parallel(cfg, args.eval_n, arms, workers=args.eval_workers)
        for label, adapter in arms:
            r = scored[label]
            evals[label] = {**asdict(r), "accuracy": r.accuracy}
            (out / f"eval-{label}.json").write_text(json.dumps({"adapter": str(adapter or ""), **evals[label]}, indent=1))
    speed = speed_verdict(swarm, trl, args.target)
    accuracy = accuracy_verdict(evals.get("swarm"), evals.get("trl-equal"))
    table, goal = markdown_table(swarm, trl, evals, args.target, equal_s), goal_line(speed, accuracy)
    report = {"target": args.target, "swarm": swarm, "trl": trl, "trl_cap_s": cap, "trl_equal_adapter_wall_s": equal_s,
              "trl_run": trl_summary, "evals": evals, "speed": speed, "accuracy": accuracy, "goal": goal}
    (out / "tta.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "tta.md").write_text(table + "\n\n" + goal + "\n")
    print(table + "\n\n" + goal, flush=True)
    return 0
