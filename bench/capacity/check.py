"""``swarm-bench capacity --profile P --check CONFIG``: predict a run from the profile, run it, compare.

The whole loop in one command, in this order:

1. the prediction (:mod:`bench.capacity.predict`) from the profile alone and the run's settings
   (batch, staleness, nodes, cores, kill step) -- written to ``prediction.json`` before the run;
2. the real run, ``learner.demo.run_demo`` (in-process learner, ``swarm-node`` processes over
   libp2p on 127.0.0.1), with the learner pinned to one core and every node to another;
   ``churn`` kills one node with SIGKILL as soon as the learner has written the step half-way;
3. learner utilisation, samples/s and dropped-group fraction, predicted against measured from
   the run's ``metrics.jsonl`` (steps after the first), each with its error and a verdict
   (within 15% or not); every row is printed, good or bad (``check.json`` keeps them).

Configurations (:data:`CONFIGS`): ``learner-bound`` (llama.cpp nodes, the learner's step is the
bottleneck), ``swarm-bound`` (torch nodes, generation is the bottleneck) and ``churn``
(``swarm-bound`` with one of its nodes killed half-way and a short lease timeout).
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from bench.capacity.predict import NodeSpec, RunSpec, Summary, predict_summary, summarise

#: Relative error the issue allows between prediction and measurement.
TOLERANCE = 0.15
#: Adapter transfer rate assumed on loopback (py-libp2p bulk transfer, measured 110-130 MB/s).
LOOPBACK_BPS = 110e6
#: Seconds between two looks of the pinning/kill watcher at the run.
WATCH_S = 0.2


@dataclass(frozen=True)
class CheckConfig:
    """One configuration of the check (the run's settings; its durations come from the profile)."""

    backend: str
    """Node backend (its speed and adapter install time are read from the profile)."""
    nodes: int = 2
    steps: int = 6
    staleness: int = 1
    kill_half_way: bool = False
    """Churn: kill node 0 after step ``steps // 2``."""
    lease_timeout_s: float = 120.0
    learner_cpu: int = 0
    node_cpu: int = 1


CONFIGS: dict[str, CheckConfig] = {
    "learner-bound": CheckConfig(backend="llamacpp"),
    "swarm-bound": CheckConfig(backend="torch"),
    "churn": CheckConfig(backend="torch", steps=8, kill_half_way=True, lease_timeout_s=30.0),
}


def specs_from_profile(prof: dict, cfg: CheckConfig, prompts_per_step: int | None = None,
                       group_size: int | None = None, max_tokens: int | None = None,
                       link_Bps: float = LOOPBACK_BPS, verify: dict | None = None,
                       seed: int = 0) -> tuple[RunSpec, list[NodeSpec]]:
    """The predicted run's settings and nodes from a profile (pure). The workload defaults to
    the profile's; another one scales group time with completions x completion tokens and the
    learner step with samples x (prompt + completion) tokens. ``verify`` is the run's
    ``[verify]`` settings (``enabled``, ``first_groups``, ``sample_frac``, ``budget_s_per_step``)
    and ``seed`` its ``train.seed``; the cost of a check is the profile's ``verify_s`` (absent
    in older profiles: verification is then left out of the prediction)."""
    pw = prof["workload"]
    node = (prof.get("nodes") or {}).get(cfg.backend)
    if node is None:
        raise ValueError(f"the profile has no measurement of backend {cfg.backend!r} "
                         f"(has: {', '.join(prof.get('nodes') or {}) or 'none'})")
    lp, ad = prof.get("learner"), prof.get("adapter") or {}
    if not lp:
        raise ValueError("the profile has no learner measurement (it was taken with --no-learner)")
    g = prompts_per_step or int(pw["prompts_per_step"])
    G = group_size or int(pw["group_size"])
    mt = max_tokens or int(pw["max_tokens"])
    ctok_prof = float(node["completion_tokens"])
    ctok = ctok_prof * mt / float(pw["max_tokens"])
    group_s = float(node["group_s"]) * (G * ctok) / (int(pw["group_size"]) * ctok_prof)
    p_tok = float(lp.get("prompt_tokens", pw.get("prompt_tokens", 0)))
    prof_tokens = float(lp["samples"]) * (p_tok + float(lp["tokens"]) / float(lp["samples"]))
    train_s = float(lp["train_s"]) * g * G * (p_tok + ctok) / prof_tokens
    install = float((ad.get("install_s") or {}).get(cfg.backend, 0.0))
    v = verify or {}
    verify_s = 0.0
    if v.get("enabled", True) and lp.get("verify_s"):  # one group: its tokens as the profile's group
        verify_s = float(lp["verify_s"]) * G * (p_tok + ctok) / (int(pw["group_size"]) * (p_tok + ctok_prof))
    run = RunSpec(prompts_per_step=g, group_size=G, steps=cfg.steps, train_s=train_s,
                  other_s=float(lp.get("publish_s", 0.0)), mode="async", staleness=cfg.staleness,
                  diss_s=float(ad.get("bytes_fp32", 0)) / link_Bps, lease_timeout_s=cfg.lease_timeout_s,
                  verify_s=verify_s, verify_first=int(v.get("first_groups", 2)),
                  verify_frac=float(v.get("sample_frac", 0.25)), verify_budget_s=float(v.get("budget_s_per_step", 10.0)),
                  verify_seed=int(seed))
    kill = cfg.steps // 2 if cfg.kill_half_way else None
    nodes = [NodeSpec(f"node-{i}", group_s=group_s, install_s=install, core=cfg.node_cpu,
                      killed_after_step=kill if i == 0 else None) for i in range(cfg.nodes)]
    return run, nodes


@dataclass
class Row:
    metric: str
    predicted: float
    measured: float
    error: float
    absolute: bool
    """The error is a difference of fractions (the measured value is 0, so no relative error)."""

    @property
    def ok(self) -> bool:
        return self.error <= TOLERANCE

    def line(self) -> str:
        err = f"{self.error:.3f} abs" if self.absolute else f"{self.error:.1%}"
        verdict = "within 15%" if self.ok else "OUTSIDE 15%"
        return f"{self.metric:24}{self.predicted:11.3f}{self.measured:11.3f}{err:>11}  {verdict}"


def compare(pred: Summary, meas: Summary) -> list[Row]:
    """Predicted vs measured: relative error, or absolute for a fraction measured as 0."""
    rows = []
    for label, p, m in (("learner utilisation", pred.utilisation, meas.utilisation),
                        ("samples/s", pred.samples_per_s, meas.samples_per_s),
                        ("dropped-group fraction", pred.dropped_frac, meas.dropped_frac)):
        if m > 0:
            rows.append(Row(label, p, m, abs(p - m) / m, False))
        else:
            rows.append(Row(label, p, m, abs(p - m), True))
    return rows


def table(rows: list[Row]) -> str:
    head = f"{'':24}{'predicted':>11}{'measured':>11}{'error':>11}  verdict"
    return "\n".join([head] + [r.line() for r in rows])


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out += [int(x) for x in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            pass
    return out


def _is_node(pid: int, index: int) -> bool:
    """Is ``pid`` the demo's ``swarm-node`` process number ``index`` (named ``node-<index>...``)?"""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(a == b"--name" and i + 1 < len(args) and args[i + 1].startswith(f"node-{index}".encode())
               for i, a in enumerate(args))


class Watcher(threading.Thread):
    """Pins every child process (the nodes) to ``node_cpu``; for churn, kills the first node
    once ``metrics.jsonl`` has ``kill_after`` rows."""

    def __init__(self, node_cpu: int | None, metrics: Path, kill_after: int | None):
        super().__init__(daemon=True)
        self.node_cpu, self.metrics, self.kill_after = node_cpu, metrics, kill_after
        self.stop = threading.Event()
        self.seen: list[int] = []
        self.killed: dict | None = None
        self.t0 = time.monotonic()

    def run(self) -> None:
        from bench.capacity.profile import pin_threads

        while not self.stop.wait(WATCH_S):
            for pid in _children(os.getpid()):
                if pid not in self.seen:
                    self.seen.append(pid)
                try:
                    if self.node_cpu is not None:
                        pin_threads({self.node_cpu}, pid)
                except OSError:
                    pass  # it ended
            if self.kill_after is not None and self.killed is None and self.seen:
                try:
                    rows = sum(1 for x in self.metrics.read_text().splitlines() if x.strip())
                except OSError:
                    rows = 0
                victim = next((pid for pid in self.seen if _is_node(pid, 0)), None)
                if rows >= self.kill_after and victim is not None:
                    os.kill(victim, signal.SIGKILL)
                    self.killed = {"pid": victim, "after_step": rows, "at_s": round(time.monotonic() - self.t0, 1)}
                    print(f"capacity check: killed node-0 (pid {victim}) after step {rows}", flush=True)


def add_arguments(parser) -> None:
    parser.add_argument("--check", choices=sorted(CONFIGS), help="predict from --profile, run that configuration, compare")
    parser.add_argument("--check-steps", type=int, help="check: learner steps of the run (default: the configuration's)")
    parser.add_argument("--check-out", help="check: output directory (default runs/capacity-check-<config>-<time>)")
    parser.add_argument("--predict-only", action="store_true", help="check: print the prediction, do not run")


def run_check(args) -> int:
    from bench.capacity.profile import load_profile

    if not args.profile:
        raise SystemExit("swarm-bench capacity --check needs --profile (from `swarm-bench profile`)")
    prof = load_profile(args.profile)
    cfg = CONFIGS[args.check]
    if args.check_steps:
        cfg = replace(cfg, steps=args.check_steps)
    from learner.config import LearnerConfig

    learner_defaults = LearnerConfig()  # the run's learner settings (measure() changes none of these)
    try:
        run, nodes = specs_from_profile(prof, cfg, args.prompts_per_step, args.group_size, args.max_tokens,
                                        verify=asdict(learner_defaults.verify), seed=learner_defaults.train.seed)
        pred, pred_rows = predict_summary(run, nodes)
    except (ValueError, KeyError) as e:
        raise SystemExit(f"swarm-bench capacity --check: {e}")
    out = Path(args.check_out or f"runs/capacity-check-{args.check}-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    prediction = {"config": args.check, "settings": asdict(cfg), "run": asdict(run), "nodes": [asdict(n) for n in nodes],
                  "summary": asdict(pred), "steps": [asdict(r) for r in pred_rows], "profile": str(args.profile)}
    (out / "prediction.json").write_text(json.dumps(prediction, indent=1))
    print(f"capacity check {args.check}: predicted from {args.profile} before the run: {cfg.nodes} x {cfg.backend} "
          f"({nodes[0].group_s:.2f} s per group alone on core {cfg.node_cpu}), T_train {run.train_s:.2f} s, "
          f"S={run.staleness}, verification {run.verify_s:.2f} s per checked group: utilisation {pred.utilisation:.3f}, {pred.samples_per_s:.3f} samples/s, "
          f"dropped {pred.dropped_frac:.3f}", flush=True)
    if args.predict_only:
        return 0
    max_tokens = args.max_tokens or int(prof["workload"]["max_tokens"])
    measured, info = measure(cfg, run, max_tokens, out / "run")
    rows = compare(pred, measured)
    text = table(rows)
    print(f"capacity check {args.check}: {measured.steps} steps compared (after step {run.skip}); "
          f"load average before {info['load_before']}, after {info['load_after']}")
    print(text)
    print(inputs_line(run, nodes, info))
    replay = replay_with_run_durations(run, nodes, info)
    if replay is not None:
        print("the same replay fed the run's own durations (consistency of the protocol model, not a prediction):")
        print(table(compare(replay, measured)))
    report = {"config": args.check, "prediction": asdict(pred), "measured": asdict(measured), **info,
              "rows": [{**asdict(r), "ok": r.ok} for r in rows],
              "replay_with_run_durations": asdict(replay) if replay is not None else None}
    (out / "check.json").write_text(json.dumps(report, indent=1))
    (out / "check.md").write_text(text + "\n")
    if not all(r.ok for r in rows):
        raise SystemExit(1)  # scripts see a bad row in the exit status
    return 0


def inputs_line(run: RunSpec, nodes: list[NodeSpec], info: dict) -> str:
    """The profile's durations beside the run's own (where an error comes from; not compared)."""
    steps = info.get("measured_steps", [])[run.skip:]
    train = [float(r["train_s"]) for r in steps if isinstance(r.get("train_s"), (int, float))]
    sharing = sum(1 for n in nodes if n.core == nodes[0].core)
    per_node = list((info.get("node_group_s") or {}).values())
    parts = [f"T_train profile {run.train_s:.1f} s, run mean {sum(train) / len(train):.1f} s" if train else ""]
    if per_node:
        parts.append(f"seconds per group per node profile {nodes[0].group_s * sharing:.1f} (shared by {sharing}), "
                     f"run {', '.join(f'{x:.1f}' for x in per_node)}")
    return "inputs (not compared): " + "; ".join(x for x in parts if x)


def replay_with_run_durations(run: RunSpec, nodes: list[NodeSpec], info: dict) -> Summary | None:
    """The replay with the run's mean learner step and per-node group times in place of the
    profile's: separates the protocol model's error from the profile's (None if unknown)."""
    steps = info.get("measured_steps", [])[run.skip:]
    per_node = list((info.get("node_group_s") or {}).values())
    if not steps or not per_node:
        return None
    train = sum(float(r["train_s"]) for r in steps) / len(steps)
    other = sum(max(0.0, float(r["step_time_s"]) - float(r["train_s"]) - float(r["learner_idle_s"]))
                for r in steps) / len(steps)
    sharing = sum(1 for n in nodes if n.core == nodes[0].core)
    group_s = sum(per_node) / len(per_node) / sharing
    try:
        return predict_summary(replace(run, train_s=train, other_s=other),
                               [replace(n, group_s=group_s) for n in nodes])[0]
    except ValueError:
        return None


def measure(cfg: CheckConfig, run: RunSpec, max_tokens: int, run_dir: Path) -> tuple[Summary, dict]:
    """The real run with pinned cores; its summary over the same steps as the prediction."""
    from bench.capacity.profile import pin_threads

    pin_threads({cfg.learner_cpu})  # before torch starts its threads: they inherit it
    from learner.cli import validate
    from learner.config import LearnerConfig
    from learner.demo import run_demo
    from learner.metrics import read_metrics
    from swarm.config import load_config

    overrides = [f"train.steps={run.steps}", f"train.prompts_per_step={run.prompts_per_step}",
                 f"train.group_size={run.group_size}", f"train.max_tokens={max_tokens}", "train.torch_threads=1",
                 "sync.mode=async",
                 f"sync.max_staleness={run.staleness}", f"sync.lease_timeout_s={cfg.lease_timeout_s}"]
    lcfg = validate(load_config(LearnerConfig, None, overrides))
    load_before = [round(x, 2) for x in os.getloadavg()]
    # the demo pins the nodes itself where it can (node_cpus); otherwise the watcher does
    own_pinning = "node_cpus" in inspect.signature(run_demo).parameters
    kw = {"node_cpus": {cfg.node_cpu}} if own_pinning else {}
    watcher = Watcher(None if own_pinning else cfg.node_cpu, run_dir / "metrics.jsonl",
                      run.steps // 2 if cfg.kill_half_way else None)
    watcher.start()
    t0 = time.perf_counter()
    try:
        run_demo(lcfg, cfg.nodes, run_dir, backends=[cfg.backend] * cfg.nodes, **kw)
    finally:
        watcher.stop.set()
        watcher.join(timeout=5)
    rows = read_metrics(run_dir / "metrics.jsonl")
    if len(rows) <= run.skip:
        raise SystemExit(f"capacity check: the run finished {len(rows)} step(s); nothing to compare")
    info = {"load_before": load_before, "load_after": [round(x, 2) for x in os.getloadavg()],
            "wall_s": round(time.perf_counter() - t0, 1), "killed": watcher.killed, "run_dir": str(run_dir),
            "measured_steps": [{k: r.get(k) for k in ("step", "step_time_s", "learner_idle_s", "train_s", "samples",
                                                      "dropped", "staleness_hist")} for r in rows]}
    try:
        swarm = json.loads((run_dir / "swarm.json").read_text())
        info["node_group_s"] = {p[-6:]: n["gen_s"] / n["groups"] for p, n in swarm["nodes"].items() if n.get("groups")}
    except (OSError, ValueError, KeyError):
        pass
    return summarise(rows, run.group_size, run.skip), info
