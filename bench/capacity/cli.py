"""``swarm-bench capacity``: plan the swarm for a learner (model, cheapest mix, simulation, plots).

Worker classes come from ``--workers NAME[:key=value,...]`` (repeatable). A NAME that is a
backend in the ``--profile`` file inherits its measured speed. Keys: ``tok_s`` (generated
tokens/s of one node on a whole group), ``group_s`` (seconds per group, overrides tok_s),
``cost_h`` (price per online hour), ``avail`` (online fraction), ``down_mbps``/``up_mbps``
(Mbit/s), ``max`` (most nodes the planner may use), ``count`` (nodes to evaluate as given),
``session_s`` (mean online session, for the simulator's churn). Example::

    swarm-bench capacity --profile prof.json --workers llamacpp:cost_h=0.02,max=60 \\
        --workers gpu:tok_s=2500,cost_h=0.5,max=8,down_mbps=500 --staleness 0,1,2,4 --plots out/

``--check learner-bound|swarm-bound|churn`` instead predicts a pinned demo run from the
profile alone, runs it and compares (see :mod:`bench.capacity.check`). ``--validate RUN_DIR``
checks the model's consistency with a finished run fed that run's own durations (see
:mod:`bench.capacity.validate`; not a prediction). Scaling from a profile to another workload: group time is
proportional to group size x completion tokens, and the learner step to batch tokens.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path

from bench.capacity.model import INF, Network, WorkerClass, Workload, evaluate

SPEC_KEYS = ("tok_s", "group_s", "cost_h", "avail", "down_mbps", "up_mbps", "max", "count", "session_s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", help="profile file written by `swarm-bench profile`")
    parser.add_argument("--config", metavar="TOML",
                        help="the learner's run config (configs/*.toml): batch shape, staleness and dissemination "
                             "(fan-out, chunk size, mode) are read from it; without it the learner's defaults")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field of that config, as swarm-learner launch --set (repeatable)")
    parser.add_argument("--workers", action="append", default=[], metavar="SPEC", help="worker class NAME[:key=value,...]")
    parser.add_argument("--prompts-per-step", type=int, help="GRPO groups per step (default: the profile's)")
    parser.add_argument("--group-size", type=int, help="completions per group (default: the profile's)")
    parser.add_argument("--max-tokens", type=int, help="max tokens per completion (default: the profile's)")
    parser.add_argument("--train-s", type=float, help="learner step seconds (default: the profile's, scaled)")
    parser.add_argument("--overhead-s", type=float, default=0.0, help="other learner seconds per step")
    parser.add_argument("--staleness", default=None,
                        help="comma-separated staleness bounds S to plan for (default 0,1,2,4; with --config, "
                             "its sync.max_staleness)")
    parser.add_argument("--target", type=float, default=0.95, help="target learner utilisation for the planner")
    parser.add_argument("--adapter-mb", type=float, help="adapter size as sent, MB (default: the profile's fp16 size)")
    parser.add_argument("--learner-up-mbps", type=float, default=1000.0, help="learner upload, Mbit/s (0: unlimited)")
    parser.add_argument("--topology", choices=["tree", "star"], default=None,
                        help="adapter dissemination (default: the config's dissem.mode; direct counts as star)")
    parser.add_argument("--fanout", type=int, default=None, help="children per relay in the tree (default: dissem.fan_out)")
    parser.add_argument("--chunk-kb", type=float, default=None, help="relay chunk size, KiB (default: dissem.chunk_bytes)")
    parser.add_argument("--learner-cost-h", type=float, default=0.0, help="learner price per hour")
    parser.add_argument("--simulate", type=int, default=0, metavar="STEPS", help="also simulate each plan for STEPS steps")
    parser.add_argument("--jitter", type=float, default=0.1, help="simulation: coefficient of variation of group time")
    parser.add_argument("--stragglers", type=float, default=0.02, help="simulation: fraction of straggler groups (4x)")
    parser.add_argument("--plots", metavar="DIR", help="write util_vs_workers.png and cost_vs_util.png here")
    parser.add_argument("--validate", metavar="RUN_DIR", help="compare the model with a measured run instead")
    parser.add_argument("--skip", type=int, default=1, help="validation: warm-up steps to leave out")
    parser.add_argument("--diss-s", type=float, default=0.0, help="validation: adapter dissemination delay, s")
    parser.add_argument("--pipeline-nodes", action="append", default=[], metavar="SPEC",
                        help="nodes for pipeline-sharded generation NAME:mem_gb=..,tok_s=..[,count=..,cost_h=..,whole=1]; "
                             "the layer allocator groups them and each pipeline joins the plan as one worker")
    parser.add_argument("--model-config", help="config.json of the model for --pipeline-nodes (default: the embedded model)")
    parser.add_argument("--dtype-bytes", type=int, default=2, help="bytes per weight on pipeline nodes (default bf16/fp16)")
    parser.add_argument("--prompt-tokens", type=int, default=512,
                        help="longest prompt, tokens: with --max-tokens it sets the KV budget of pipeline nodes")
    from bench.capacity.check import add_arguments as add_check_arguments

    add_check_arguments(parser)


def parse_spec(spec: str, profile: dict | None, group_size: int, ctoks: float) -> tuple[WorkerClass, int | None]:
    """One ``--workers`` spec -> (class, fixed count or None). ``ValueError`` on a bad spec."""
    name, _, rest = spec.partition(":")
    name = name.strip()
    if not name:
        raise ValueError(f"worker spec {spec!r}: missing a name")
    kv: dict[str, float] = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, val = item.partition("=")
        if not eq or key not in SPEC_KEYS:
            raise ValueError(f"worker spec {spec!r}: {item!r} is not key=value with key in {', '.join(SPEC_KEYS)}")
        try:
            kv[key] = float(val)
        except ValueError:
            raise ValueError(f"worker spec {spec!r}: {key} needs a number, got {val!r}") from None
    node = ((profile or {}).get("nodes") or {}).get(name)
    if "group_s" in kv:
        group_s = kv["group_s"]
    elif "tok_s" in kv or node:
        tok_s = kv.get("tok_s") or float(node["tokens_per_s"])
        group_s = group_size * ctoks / tok_s if tok_s > 0 else INF
    else:
        raise ValueError(f"worker spec {spec!r}: give tok_s or group_s (or name a backend of the profile)")
    mbps = lambda k: kv[k] * 1e6 / 8 if kv.get(k, 0) > 0 else INF  # noqa: E731
    wc = WorkerClass(name=name, group_s=group_s, cost_per_h=kv.get("cost_h", 0.0), availability=kv.get("avail", 1.0),
                     down_Bps=mbps("down_mbps"), up_Bps=mbps("up_mbps"), max_count=int(kv.get("max", 64)),
                     session_s=kv.get("session_s", INF))
    return wc, (int(kv["count"]) if "count" in kv else None)


def learner_config(path: str | None, overrides: list[str]):
    """The learner's :class:`~learner.config.LearnerConfig`: the file's, or the defaults ``launch`` uses."""
    from learner.config import LearnerConfig
    from swarm.config import ConfigError, load_config

    try:
        return load_config(LearnerConfig, Path(path) if path else None, overrides)
    except (ConfigError, OSError) as e:
        raise ValueError(f"--config: {e}") from None


def apply_learner_config(args: argparse.Namespace, cfg) -> None:
    """Fill what the command line left out from the learner's config: dissemination always (so the
    planner models the tree the learner builds), the batch shape and staleness when ``--config`` names
    a run (without it they come from the profile, as before)."""
    d = cfg.dissem
    if args.topology is None:
        args.topology = "tree" if d.mode == "tree" else "star"
    if args.fanout is None:
        args.fanout = d.fan_out
    if args.chunk_kb is None:
        args.chunk_kb = d.chunk_bytes / 1024
    if args.config:
        t = cfg.train
        args.prompts_per_step = args.prompts_per_step or t.prompts_per_step
        args.group_size = args.group_size or t.group_size
        args.max_tokens = args.max_tokens or t.max_tokens
        if args.staleness is None:
            args.staleness = str(cfg.sync.max_staleness)
    if args.staleness is None:
        args.staleness = "0,1,2,4"


def build(args: argparse.Namespace) -> tuple[Workload, list[WorkerClass], list[int | None], Network]:
    from bench.capacity.profile import load_profile

    prof = load_profile(args.profile) if args.profile else None
    pw = (prof or {}).get("workload", {})
    g = args.prompts_per_step or pw.get("prompts_per_step")
    G = args.group_size or pw.get("group_size")
    max_tokens = args.max_tokens or pw.get("max_tokens")
    if not (g and G and max_tokens):
        raise ValueError("give --prompts-per-step, --group-size and --max-tokens (or a --profile)")
    # completion length: the profile's measured fill of max_tokens, applied to this max_tokens
    fills = [n["completion_tokens"] / pw["max_tokens"] for n in (prof or {}).get("nodes", {}).values()
             if pw.get("max_tokens")]
    ctoks = max_tokens * (sum(fills) / len(fills) if fills else 1.0)
    train_s = args.train_s
    if train_s is None:
        lp = (prof or {}).get("learner")
        if not lp:
            raise ValueError("give --train-s (the profile has no learner measurement)")
        train_s = lp["train_s"] * (g * G * ctoks) / max(1.0, float(lp["tokens"]))
    adapter = args.adapter_mb * 1e6 if args.adapter_mb is not None else \
        float(((prof or {}).get("adapter") or {}).get("bytes_fp16", 0))
    if not args.workers and not args.pipeline_nodes:
        if not prof or not prof.get("nodes"):
            raise ValueError("give at least one --workers spec")
        args.workers = list(prof["nodes"])
    parsed = [parse_spec(s, prof, G, ctoks) for s in args.workers]
    if args.pipeline_nodes:
        from bench.capacity.pipelines import describe, model_spec, plan_classes

        spec = model_spec(args.model_config, args.dtype_bytes)
        plan, pipes = plan_classes(args.pipeline_nodes, spec, G, int(max_tokens) + args.prompt_tokens, ctoks)
        print(describe(plan))
        parsed += [(c, 1) for c in pipes]
    workload = Workload(prompts_per_step=g, group_size=G, train_s=train_s, overhead_s=args.overhead_s,
                        learner_cost_per_h=args.learner_cost_h)
    net = Network(adapter_bytes=adapter, topology=args.topology, fanout=args.fanout, chunk_bytes=args.chunk_kb * 1024,
                  learner_up_Bps=args.learner_up_mbps * 1e6 / 8 if args.learner_up_mbps > 0 else INF)
    return workload, [c for c, _ in parsed], [n for _, n in parsed], net


def _money(x: float) -> str:
    return "inf" if not math.isfinite(x) else f"{x:.4g}"


def run(args: argparse.Namespace) -> int:
    if args.check:
        from bench.capacity.check import run_check

        return run_check(args)
    if args.validate:
        from bench.capacity.validate import report, validate_run

        v = validate_run(args.validate, skip=args.skip, diss_s=args.diss_s)
        print(report(v))
        return 0
    try:
        apply_learner_config(args, learner_config(args.config, args.overrides))
        staleness = [int(x) for x in args.staleness.split(",") if x.strip()]
        workload, classes, fixed, net = build(args)
    except (ValueError, KeyError) as e:
        raise SystemExit(f"swarm-bench capacity: {e}")
    print(f"workload: {workload.prompts_per_step} prompts x {workload.group_size} = {workload.batch} rollouts per step, "
          f"T_train {workload.train_s:.2f} s, adapter {net.adapter_bytes / 1e6:.2f} MB via {net.topology}")
    for c in classes:
        print(f"  class {c.name}: {c.group_s:.2f} s per group, cost {c.cost_per_h}/h, availability {c.availability}, "
              f"max {c.max_count}")
    if all(n is not None for n in fixed):
        print("\ngiven swarm: " + ", ".join(f"{n} x {c.name}" for c, n in zip(classes, fixed)))
        print(f"{'mode':>10} {'S':>3} {'util':>6} {'samples/s':>10} {'step s':>8} {'mean lag':>9} {'wasted':>7} "
              f"{'cost/step':>10} {'cost/1k':>9}")
        for mode, S in [("sequential", 0)] + [("async", s) for s in staleness]:
            p = evaluate(replace(workload, staleness=S, mode=mode), classes, fixed, net)
            print(f"{mode:>10} {S:>3} {p.utilisation:6.3f} {p.samples_per_s:10.2f} {p.step_s:8.2f} {p.mean_lag:9.2f} "
                  f"{p.wasted:7.2f} {_money(p.cost_per_step):>10} {_money(p.cost_per_1k_samples):>9}")
        if args.simulate:
            _simulate_rows(args, workload, classes, fixed, net, staleness)
    _plan(args, workload, classes, net, staleness)
    if args.plots:
        from bench.capacity.plots import cost_vs_util, util_vs_workers

        out = Path(args.plots)
        out.mkdir(parents=True, exist_ok=True)
        util_vs_workers(workload, classes[0], net, staleness, classes[0].max_count, out / "util_vs_workers.png")
        cost_vs_util(workload, classes, net, staleness, out / "cost_vs_util.png")
        print(f"\nplots: {out / 'util_vs_workers.png'}, {out / 'cost_vs_util.png'}")
    return 0


def _plan(args, workload: Workload, classes: list[WorkerClass], net: Network, staleness: list[int]) -> None:
    from bench.capacity.provision import cheapest

    print(f"\ncheapest mix for learner utilisation >= {args.target:.2f}:")
    print(f"{'S':>3}  {'mix':<28} {'util':>6} {'margin':>7} {'raw cap':>8} {'P(online)':>10} {'mean lag':>9} "
          f"{'cost/h':>8} {'cost/step':>10} {'cost/1k':>9}")
    for S in staleness:
        w = replace(workload, staleness=S, mode="async")
        plan = cheapest(w, classes, args.target, net)
        if plan is None:
            print(f"{S:>3}  infeasible within the class maxima")
            continue
        p = plan.prediction
        print(f"{S:>3}  {plan.describe():<28} {p.utilisation:6.3f} {plan.util_margin:+7.3f} {plan.capacity_margin:+8.1%} "
              f"{plan.p_enough_online:10.2f} {p.mean_lag:9.2f} {_money(p.cost_per_h):>8} {_money(p.cost_per_step):>10} "
              f"{_money(p.cost_per_1k_samples):>9}")
        if args.simulate:
            _simulate_rows(args, workload, classes, plan.counts, net, [S], header=False)


def _simulate_rows(args, workload, classes, counts, net, staleness, header: bool = True) -> None:
    from bench.capacity.simulate import SimConfig, simulate

    if header:
        print("\nsimulation vs model:")
    cfg = SimConfig(steps=args.simulate, jitter_cv=args.jitter, straggler_prob=args.stragglers)
    for S in staleness:
        w = replace(workload, staleness=S, mode="async")
        if sum(counts) == 0:
            continue
        p, s = evaluate(w, classes, counts, net), simulate(w, classes, counts, net, cfg)
        print(f"     sim S={S}: util {s.utilisation:.3f} (model {p.utilisation:.3f}), samples/s {s.samples_per_s:.2f} "
              f"(model {p.samples_per_s:.2f}), mean lag {s.mean_lag:.2f} (model {p.mean_lag:.2f}), "
              f"wasted {s.wasted:.2f} (model {p.wasted:.2f}), {s.wall_s:.1f} s")
