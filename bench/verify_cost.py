"""What rollout verification costs: per verified group, and over the default demo with it on and off.

Three parts (``swarm-bench verify-cost per-group`` / ``demo`` / ``summary --run-dir RUN``, the last
for any finished run: its draw checks per class, largest statistic against the tolerance, and the
checks' seconds per step):

- ``per-group``: the learner's default model and trainer (``[train]`` defaults), groups of the
  default task's prompts with completions of ``--tokens`` tokens. Times the re-scoring of one
  group of ``--group-size`` completions three ways, each with ``--threads`` torch threads:
  ``before`` (the earlier verifier: whole sequences in float32, no KV reuse), ``after`` (the
  verifier as a run uses it: :meth:`learner.verify.Verifier.rescore_groups` with the config's
  ``verify`` section, the trainer's shared-prompt pass at its precision) and ``after_fp32``
  (the same pass in float32), against one training step on ``--groups`` such groups (the
  trainer's ``train_step``, torch threads of the trainer). Prints the median seconds per group
  and per step, the fraction of a step one group costs, and how far the log-probs of the
  ``after`` pass are from the float32 ones (max and mean |difference|). Then ``in_step`` (the
  default in sequential mode, ``verify.in_step``): training steps without and with ``--checked``
  groups verified on the step's own forward, alternated; the checks' own seconds per group and
  the step-time difference per checked group.
- ``demo``: the default demo config (``swarm-learner demo``: learner plus ``--nodes``
  llama.cpp nodes on 127.0.0.1) twice with the same seed, verification on then off (one after
  the other; or each arm in its own process with ``--only on|off`` and the same ``--out``, e.g.
  side by side under ``taskset``), ``--steps`` steps each; per run: training time (wall time of
  the last step), the step at which the rolling mean reward first reaches ``--target`` and its
  time, verified groups and the seconds spent re-scoring them; then the held-out accuracy of
  both final adapters with ``swarm-learner eval``. Writes ``verify_cost.json`` and
  ``verify_cost.md`` in ``--out``; the load average is printed with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("part", choices=("per-group", "demo", "summary"), help="what to measure (summary: a finished run's checks)")
    p.add_argument("--run-dir", type=Path, default=None, help="summary: the run directory (its metrics.jsonl and swarm.json)")
    p.add_argument("--groups", type=int, default=8, help="per-group: groups timed (and trained on in one step)")
    p.add_argument("--group-size", type=int, default=8, help="per-group: completions per group")
    p.add_argument("--tokens", type=int, default=48, help="per-group: tokens per completion")
    p.add_argument("--threads", type=int, default=1, help="per-group: torch threads while re-scoring")
    p.add_argument("--checked", type=int, default=2, help="per-group: groups verified inside each timed training step")
    p.add_argument("--steps", type=int, default=20, help="demo: learner steps per run")
    p.add_argument("--nodes", type=int, default=2, help="demo: swarm-node processes per run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=0.8, help="demo: rolling mean reward to time")
    p.add_argument("--eval-n", type=int, default=64, help="demo: held-out problems per evaluation (0 = skip)")
    p.add_argument("--only", choices=("on", "off"), default=None, help="demo: run only this arm")
    p.add_argument("--out", type=Path, default=None, help="output directory (default runs/verify-cost-<time>)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for both arms (repeatable)")


def load() -> str:
    return "load average %.2f %.2f %.2f" % os.getloadavg()


# -- per group ----------------------------------------------------------------------------------
def score_before(trainer, prompt_ids: list[int], completions: list[list[int]], temperature: float):
    """The earlier verifier's pass (kept here as the reference): one float32 decoder pass over the
    whole right-padded sequences, then LM head and softmax row by row."""
    import numpy as np
    import torch

    model, dev, t = trainer.model, trainer.device, max(float(temperature), 1e-6)
    model.eval()
    base = model.get_base_model()
    decoder, head = base.get_decoder(), base.get_output_embeddings()
    width = max(len(ids) for ids in completions)
    rows = [list(prompt_ids) + list(ids) + [0] * (width - len(ids)) for ids in completions]
    p0, out = len(prompt_ids) - 1, []
    with torch.inference_mode():
        hidden = decoder(input_ids=torch.tensor(rows, dtype=torch.long, device=dev)).last_hidden_state[:, p0:p0 + width]
        for i, ids in enumerate(completions):
            logp = torch.log_softmax(head(hidden[i, :len(ids)]).float() / t, dim=-1)
            p = logp.exp()
            lp = logp.gather(1, torch.tensor(list(ids), device=dev)[:, None])[:, 0]
            h = -(p * logp).sum(-1)
            out.append((lp.double().numpy(), h.double().numpy(), ((p * logp * logp).sum(-1) - h * h).double().numpy()))
    return out


def per_group(args) -> dict:
    import numpy as np
    import torch

    from learner.config import LearnerConfig
    from swarm.config import with_values
    from learner.episodes import run_task
    from learner.models import load_tokenizer, resolve_model
    from learner.trainer import TrainSample
    from learner.trainer_build import build_trainer
    from learner.verify import Verifier

    cfg = LearnerConfig()
    resolved = resolve_model("default")
    trainer = build_trainer(resolved, cfg)
    tok, task = load_tokenizer(resolved.hf_dir), run_task(cfg.task)
    rng = random.Random(args.seed)
    vocab = trainer.model.get_base_model().config.vocab_size
    groups = []
    for gi in range(args.groups):
        prompt = task.render_prompt(tok, task.problem("train", gi))
        groups.append((list(prompt), [[rng.randrange(100, vocab) for _ in range(args.tokens)]
                                      for _ in range(args.group_size)]))
    temp = cfg.train.temperature
    verifier = Verifier(trainer, cfg.verify, temp, 1.0, weights_version=0)
    fp32 = Verifier(trainer, type(cfg.verify)(precision="fp32", torch_threads=args.threads), temp, 1.0, weights_version=0)
    cfg = with_values(cfg, {"verify.torch_threads": args.threads})
    times: dict[str, list[float]] = {"before": [], "after": [], "after_fp32": []}
    diffs = []
    train_threads = torch.get_num_threads()
    for prompt, comps in groups:
        torch.set_num_threads(args.threads)
        t0 = time.perf_counter()
        ref = score_before(trainer, prompt, comps, temp)
        times["before"].append(time.perf_counter() - t0)
        torch.set_num_threads(train_threads)
        for name, v in (("after", verifier), ("after_fp32", fp32)):
            t0 = time.perf_counter()
            got = v.rescore_groups([(prompt, comps, 0)])[0]
            times[name].append(time.perf_counter() - t0)
            if name == "after":
                diffs += [np.abs(s.logprobs - r[0]) for s, r in zip(got, ref)]
        print(f"  group: before {times['before'][-1]:.2f}s after {times['after'][-1]:.2f}s "
              f"after_fp32 {times['after_fp32'][-1]:.2f}s ({load()})", flush=True)
    t0 = time.perf_counter()
    batch = [TrainSample(p, c, [-1.0] * len(c), 1.0 if j % 2 else -1.0) for p, comps in groups for j, c in enumerate(comps)]
    trainer.train_step(batch)
    step_s = time.perf_counter() - t0
    in_step = time_in_step(trainer, groups, args)
    d = np.concatenate(diffs)
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {"group_size": args.group_size, "tokens": args.tokens, "threads": args.threads,
           "prompt_tokens_mean": sum(len(p) for p, _ in groups) / len(groups),
           "seconds_per_group": {k: round(v, 3) for k, v in med.items()},
           "train_step_s": round(step_s, 2), "train_step_groups": len(groups), "train_threads": train_threads,
           "fraction_of_step": {k: round(v / step_s, 4) for k, v in med.items()},
           "speedup": round(med["before"] / med["after"], 2),
           "after_vs_fp32_logprob_abs_diff": {"max": round(float(d.max()), 4), "mean": round(float(d.mean()), 5)},
           "in_step": in_step, "load": os.getloadavg()}
    print(f"per group of {args.group_size} x {args.tokens} tokens ({args.threads} thread(s)): "
          + ", ".join(f"{k} {v:.2f}s ({100 * v / step_s:.1f}% of a step)" for k, v in med.items())
          + f"; training step on {len(groups)} groups {step_s:.1f}s ({train_threads} threads); "
          f"|lp after - fp32| max {d.max():.4f} mean {d.mean():.5f} ({load()})")
    print(f"in the training step: {in_step['seconds_per_group_own']:.3f}s per checked group of its own work "
          f"({100 * in_step['fraction_of_step_own']:.2f}% of a step), {in_step['seconds_per_group_own_draw']:.3f}s with "
          f"the draw check ({100 * in_step['fraction_of_step_own_draw']:.2f}% of a step; every group of the step: "
          f"{100 * in_step['fraction_of_step_all_checked_draw']:.2f}%), step {in_step['step_plain_s']:.2f}s -> "
          f"{in_step['step_checked_s']:.2f}s with {in_step['checked_groups']} checked, {in_step['step_draw_s']:.2f}s "
          f"with the draw check ({in_step['seconds_per_group_step_delta_draw']:+.3f}s per group) ({load()})")
    return res


def time_in_step(trainer, groups, args, repeats: int = 3) -> dict:
    """The check made on the training step's own forward (``verify.in_step``): training steps on
    the same groups without checks, with ``--checked`` of them verified in the step by the claims
    and likelihood tests alone, and with the draw check too (``learner/draw_check.py``: each
    token's distance from the uniform that drew it), alternated ``repeats`` times; the checks' own
    seconds (statistics, distances and verdict) per group, and the step time difference per checked
    group (both: what verification adds to a step)."""
    from learner.draw_check import completion_uniforms
    from learner.step_check import GroupCheck, StepChecks
    from learner.trainer import TrainSample
    from learner.verify import group_stats

    batch = [TrainSample(p, c, [-1.0] * len(c), 1.0 if j % 2 else -1.0, group_id=f"g{gi}")
             for gi, (p, comps) in enumerate(groups) for j, c in enumerate(comps)]
    k = max(1, min(args.checked, len(groups)))

    def verdict(comps):  # the real statistics, then a pass (a failed group would skip its backward)
        return lambda scored: (group_stats([[-1.0] * len(c) for c in comps], [[] for _ in comps], scored, True), None)[1]

    def checks(draw: bool) -> StepChecks:
        return StepChecks([GroupCheck(f"g{i}", len(groups[i][1]), verdict(groups[i][1]),
                                      completion_uniforms(i, [len(c) for c in groups[i][1]]) if draw else None)
                           for i in range(k)])

    times: dict[str, list[float]] = {"plain": [], "stats": [], "draw": []}
    own: dict[str, list[float]] = {"stats": [], "draw": []}
    fused = 0
    for _ in range(repeats):
        for arm in ("plain", "stats", "draw"):
            c = None if arm == "plain" else checks(arm == "draw")
            t0 = time.perf_counter()
            trainer.train_step(batch, checks=c)
            times[arm].append(time.perf_counter() - t0)
            if c is not None:
                own[arm].append(c.seconds / max(c.judged, 1))
                fused = c.fused
        print(f"  in-step: step {times['plain'][-1]:.2f}s plain, {times['stats'][-1]:.2f}s with {k} checked group(s), "
              f"{times['draw'][-1]:.2f}s with the draw check too ({fused} on the training forward); checks' own "
              f"{own['stats'][-1]:.3f}s/group, {own['draw'][-1]:.3f}s/group with the draw check ({load()})", flush=True)
    p = statistics.median(times["plain"])
    med = {arm: statistics.median(v) for arm, v in times.items()}
    own_med = {arm: statistics.median(v) for arm, v in own.items()}
    return {"checked_groups": k, "fused": fused, "step_plain_s": round(p, 2), "step_checked_s": round(med["stats"], 2),
            "step_draw_s": round(med["draw"], 2),
            "seconds_per_group_own": round(own_med["stats"], 3), "seconds_per_group_own_draw": round(own_med["draw"], 3),
            "seconds_per_group_step_delta": round((med["stats"] - p) / k, 3),
            "seconds_per_group_step_delta_draw": round((med["draw"] - p) / k, 3),
            "fraction_of_step_own": round(own_med["stats"] / p, 4),
            "fraction_of_step_own_draw": round(own_med["draw"] / p, 4),
            "fraction_of_step_all_checked_draw": round(own_med["draw"] * len(groups) / p, 4)}


# -- demo on / off ------------------------------------------------------------------------------
def arm_summary(rows: list[dict], target: float) -> dict:
    from learner.metrics import first_reaching

    hit = first_reaching(rows, target)
    vs = [r.get("verify_s", 0.0) for r in rows]
    vg = sum(r.get("verify_groups", 0) for r in rows)
    return {"steps": len(rows), "training_s": round(rows[-1]["wall_s"], 1),
            "reach_step": hit["step"] if hit else None, "reach_s": round(hit["wall_s"], 1) if hit else None,
            "rewards": [round(r["reward_mean"], 4) for r in rows],
            "verify_groups": vg, "verify_failed": sum(r.get("verify_failed", 0) for r in rows),
            "verify_s": round(sum(vs), 1), "verify_s_per_group": round(sum(vs) / vg, 3) if vg else None,
            "train_s_median": round(statistics.median(r["train_s"] for r in rows), 2),
            "wait_s_median": round(statistics.median(r.get("time_wait_s", r.get("learner_idle_s", 0.0)) for r in rows), 2),
            # the checks made inside the training step (vector work on its logits) and beside it
            # (no-grad forwards of the groups the step's forward does not see on their version)
            "in_step_s_median": round(statistics.median(r.get("verify_in_step_s", 0.0) for r in rows), 3),
            "background_s_median": round(statistics.median(r.get("time_verify_s", 0.0) for r in rows), 3),
            "replay_s": round(sum(r.get("replay_s", 0.0) for r in rows), 1),
            "draw": draw_by_class(rows)}


def draw_by_class(rows: list[dict]) -> dict:
    """Per ``class@precision`` over a run's rows: groups draw-checked, failed, the largest group
    statistic and the tolerance it was judged against."""
    out: dict[str, dict] = {}
    for r in rows:
        for key, b in (r.get("draw") or {}).items():
            o = out.setdefault(key, {"groups": 0, "failed": 0, "max_stat": 0.0, "eps": b["eps"], "allowed": b["allowed"]})
            o["groups"] += b["groups"]
            o["failed"] += b["failed"]
            o["max_stat"] = max(o["max_stat"], b["max_stat"])
    return out


def evaluate(adapter: Path, n: int, seed: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "learner.cli", "eval", "--adapter", str(adapter), "--n", str(n), "--json", str(out), "--threads", "1",
           "--set", f"task.seed={seed}", "--set", f"train.seed={seed}"]
    print("verify-cost:", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)
    return json.loads(out.read_text())


def demo(args) -> dict:
    from learner.cli import validate
    from learner.config import LearnerConfig
    from learner.demo import run_demo
    from learner.metrics import read_metrics
    from swarm.config import load_config

    out = args.out or Path("runs") / f"verify-cost-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    base = [f"task.seed={args.seed}", f"train.seed={args.seed}", f"train.steps={args.steps}", *args.overrides]
    res_path = out / "verify_cost.json"
    arms = [a for a in ("on", "off") if not args.only or a == args.only]
    for arm in arms:
        cfg = validate(load_config(LearnerConfig, None, base + [f"verify.enabled={'true' if arm == 'on' else 'false'}"]))
        print(f"verify-cost: === verification {arm} ({args.steps} steps, {args.nodes} nodes, CPUs "
              f"{sorted(os.sched_getaffinity(0))}; {load()}) ===", flush=True)
        load0 = os.getloadavg()
        run_demo(cfg, args.nodes, out / arm)
        rows = read_metrics(out / arm / "metrics.jsonl")
        merge(res_path, arm, arm_summary(rows, args.target) | {"load_start": load0, "load_end": os.getloadavg(),
                                                             "cpus": sorted(os.sched_getaffinity(0)),
                                                             "overrides": base})
    for arm in arms:
        if args.eval_n > 0 and (out / arm / "adapter").exists():
            merge(res_path, arm, {"eval": evaluate(out / arm / "adapter", args.eval_n, args.seed, out / f"eval_{arm}.json")})
    res = json.loads(res_path.read_text())
    text = table(res, args.target)
    (out / "verify_cost.md").write_text(text + "\n")
    print(text)
    return res


def merge(path: Path, arm: str, fields: dict) -> None:
    """Add ``fields`` to ``arm`` in the results file (read just before writing: the two arms may
    run side by side, each in its own process, ``--only``)."""
    res = json.loads(path.read_text()) if path.exists() else {}
    res.setdefault(arm, {}).update(fields)
    tmp = path.with_name(f"{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(res, indent=1))
    os.replace(tmp, path)


def table(res: dict, target: float) -> str:
    lines = [f"| verification | training s | rolling {target} at (step, s) | verified groups | re-scoring s (per group) "
             f"| held-out accuracy | load avg (start -> end) |", "|---|---|---|---|---|---|---|"]
    for arm in ("on", "off"):
        r = res.get(arm)
        if not r or "training_s" not in r:
            continue
        accs = {e["label"]: e["accuracy"] for e in r.get("eval", {}).get("results", []) if "label" in e}
        acc = (f"{accs['adapter']:.3f} (base {accs['base']:.3f})" if "adapter" in accs and "base" in accs
               else accs.get("adapter"))
        lines.append(f"| {arm} | {r['training_s']} | {r['reach_step']}, {r['reach_s']} | {r['verify_groups']} | "
                     f"{r['verify_s']} ({r['verify_s_per_group']}) | {acc} | "
                     f"{r['load_start'][0]:.2f} -> {r['load_end'][0]:.2f} |")
    if "training_s" in res.get("on", {}) and "training_s" in res.get("off", {}):
        on, off = res["on"], res["off"]
        lines.append("")
        lines.append(f"checks per step (median): {on['in_step_s_median']}s in the training step against a training "
                     f"step of {on['train_s_median']}s ({100 * on['in_step_s_median'] / on['train_s_median']:.2f}%), "
                     f"{on['background_s_median']}s beside it; draw check per class: {on['draw']}")
        lines.append(f"training time on/off {on['training_s'] / off['training_s']:.3f}; time to {target} on/off "
                     + (f"{on['reach_s'] / off['reach_s']:.3f}" if on["reach_s"] and off["reach_s"] else "n/a")
                     + f"; same per-step rewards: {on['rewards'] == off['rewards']}")
    return "\n".join(lines)


def summary(run_dir: Path) -> dict:
    """What a finished run's checks found and cost (``swarm-bench verify-cost summary --run-dir``):
    per ``class@precision`` the groups draw-checked, failed, the largest group statistic against the
    tolerance; per node the checks its groups passed and failed and what its trained groups passed;
    the checks' seconds per step inside and beside the training step."""
    from learner.metrics import read_metrics

    rows = read_metrics(run_dir / "metrics.jsonl")
    swarm = json.loads((run_dir / "swarm.json").read_text()) if (run_dir / "swarm.json").exists() else {}
    work = {p[-6:]: {k: w.get(k) for k in ("backend", "groups_trained", "verified", "failed", "trained_by", "untrusted")}
            for p, w in swarm.get("work", {}).items()}
    out = {"steps": len(rows), "draw": draw_by_class(rows), "nodes": work,
           "flagged": sum(r.get("verify_failed", 0) + r.get("replay_failed", 0) for r in rows),
           "in_step_s_per_step": round(statistics.median(r.get("verify_in_step_s", 0.0) for r in rows), 3),
           "background_s_per_step": round(statistics.median(r.get("time_verify_s", 0.0) for r in rows), 3),
           "train_s_per_step": round(statistics.median(r["train_s"] for r in rows), 2),
           "replay_groups": sum(r.get("replay_groups", 0) for r in rows),
           "rewards": [round(r["reward_mean"], 3) for r in rows]}
    out["in_step_fraction_of_train"] = round(out["in_step_s_per_step"] / out["train_s_per_step"], 4)
    for key, b in out["draw"].items():
        print(f"{run_dir.name}: {key}: {b['groups']} groups checked, {b['failed']} failed, largest statistic "
              f"{b['max_stat']:.4g} against {b['eps']} (allowed {b['allowed']})")
    print(json.dumps({k: v for k, v in out.items() if k != "draw"}))
    return out


def run(args) -> None:
    if args.part == "summary":
        if args.run_dir is None:
            raise SystemExit("swarm-bench verify-cost summary: --run-dir is required")
        res = summary(args.run_dir)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"summary_{args.run_dir.name}.json").write_text(json.dumps(res, indent=1))
        return
    if args.part == "per-group":
        res = per_group(args)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "per_group.json").write_text(json.dumps(res, indent=1))
    else:
        demo(args)
