"""``swarm-bench precision``: the learner's training step per precision, side by side, and what ``auto`` chose.

For each instruction-set arm (``--isa native,avx2``: ``avx2`` forces this CPU down with
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``, as an AVX2-only CPU such as an AMD EPYC
before Zen 4 runs), one child process builds the learner's own trainer
(:func:`learner.trainer_build.build_trainer`, the one ``swarm-learner launch`` runs) once per
precision (``--precisions fp32,autocast,bf16``) on the default model, then times
``train_step`` on one synthetic GRPO batch (``--prompts`` groups of ``--group`` completions,
``--prompt-len`` + ``--completion-len`` tokens) round-robin over the precisions, so the machine's
load falls on every precision alike: one warm-up step each, then ``--steps`` timed steps. A
precision whose step took more than ``--slow-s`` seconds is not stepped again (its figure is then
its one step, warm-up included, marked ``*``). Each arm also prints the start-up probe's figures
and what ``train.precision = "auto"`` resolves to there (:mod:`common.precision_probe`).

Printed per arm and precision: mean step seconds (wall and this process's CPU time: with one
torch thread the CPU time barely moves with other processes' load), each over fp32's (below 1:
faster), and whether ``auto`` takes it. The default batch is one update of the demo's step (2
groups of 8 completions, 64 + 64 tokens); its steps on 2 cores are 4 such updates.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: ``--isa`` arm -> the environment that forces it (native: nothing).
ISA_ENVS = {"native": {}, "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}
PRECISIONS = ("fp32", "autocast", "bf16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default", help="default (the embedded SmolLM2-135M) or an HF directory")
    parser.add_argument("--isa", default="native,avx2", help="comma-separated arms: native, avx2 (default both)")
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help="comma-separated, of fp32, autocast, bf16")
    parser.add_argument("--prompts", type=int, default=2, help="GRPO groups per batch (the demo's update: 2)")
    parser.add_argument("--group", type=int, default=8, help="completions per group (the demo's: 8)")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--completion-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per precision after one warm-up")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: steadier on a shared machine)")
    parser.add_argument("--slow-s", type=float, default=60.0,
                        help="a precision whose step takes longer is not stepped again (default 60)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows to this JSON file")
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> None:
    if args.worker is not None:
        return _worker(args)
    arms = [a.strip() for a in args.isa.split(",") if a.strip()]
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    bad = [a for a in arms if a not in ISA_ENVS] + [p for p in precisions if p not in PRECISIONS]
    if bad or not arms or not precisions:
        raise SystemExit(f"swarm-bench precision: unknown arm or precision {bad} (arms {', '.join(ISA_ENVS)}; "
                         f"precisions {', '.join(PRECISIONS)})")
    print(f"swarm-bench precision: load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    results = []
    for arm in arms:
        print(f"swarm-bench precision: arm {arm} ({_env_text(arm)}) ...", flush=True)
        results.append(_run_arm(args, arm, precisions))
    print()
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def _env_text(arm: str) -> str:
    return " ".join(f"{k}={v}" for k, v in ISA_ENVS[arm].items()) or "as the CPU is"


def _run_arm(args: argparse.Namespace, arm: str, precisions: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "arm.json"
        cmd = [sys.executable, "-m", "bench.cli", "precision", "--model", args.model, "--precisions", ",".join(precisions),
               "--prompts", str(args.prompts), "--group", str(args.group), "--prompt-len", str(args.prompt_len),
               "--completion-len", str(args.completion_len), "--steps", str(args.steps), "--threads", str(args.threads),
               "--slow-s", str(args.slow_s), "--worker", str(out)]
        env = {**{k: v for k, v in os.environ.items() if k not in ISA_ENVS["avx2"]}, **ISA_ENVS[arm],
               "OMP_NUM_THREADS": str(args.threads)}
        proc = subprocess.run(cmd, env=env)
        if proc.returncode != 0 or not out.is_file():
            raise SystemExit(f"swarm-bench precision: arm {arm} failed (exit {proc.returncode})")
        return {"arm": arm, "env": ISA_ENVS[arm], **json.loads(out.read_text())}


def _worker(args: argparse.Namespace) -> None:
    """One arm, in a child process whose environment forces the instruction set."""
    from bench.learner_bench import synthetic_batch
    from common.machine import machine_facts
    from common.model_cache import cache_root
    from common.precision_probe import auto_train_precision, probe
    from learner.config import LearnerConfig
    from learner.models import ResolvedModel, resolve_model
    from learner.trainer import Trainer
    from learner.trainer_build import build_trainer
    from swarm.config import load_config

    model_dir = resolve_model(args.model).hf_dir if args.model == "default" else Path(args.model)
    t0 = time.perf_counter()
    choice = auto_train_precision("cpu")
    cpu = machine_facts(with_torch=True).cpu
    found = probe(cpu)
    print(f"  auto: {choice.reason} (probe fp32 {found.fp32_s * 1e3:.1f} ms, bf16 autocast "
          f"{found.autocast_s * 1e3:.1f} ms{', cached' if found.cached else ''}; {time.perf_counter() - t0:.2f} s "
          f"with torch's import; cache {cache_root() / 'machine'})", flush=True)
    precisions = args.precisions.split(",")
    trainers: dict[str, Trainer] = {}
    for p in precisions:
        cfg = load_config(LearnerConfig, None, [f"train.precision={p}", "train.device=cpu",
                                                f"train.torch_threads={args.threads}"])
        trainer = build_trainer(ResolvedModel("bench", None, model_dir), cfg)
        assert isinstance(trainer, Trainer)  # one process, one rank
        trainers[p] = trainer
    shape = next(iter(trainers.values())).shape
    batch = synthetic_batch(shape.vocab, args.prompts, args.group, args.prompt_len, args.completion_len)
    times: dict[str, list[tuple[float, float]]] = {p: [] for p in precisions}  # (wall s, process CPU s)
    slow: set[str] = set()
    for step in range(args.steps + 1):  # step 0: warm-up
        for p in precisions:
            if p in slow:
                continue
            t, c = time.perf_counter(), time.process_time()
            trainers[p].train_step(batch)
            dt, dc = time.perf_counter() - t, time.process_time() - c
            print(f"  {p}: {'warm-up' if step == 0 else f'step {step}'} {dt:.2f} s ({dc:.2f} s CPU)", flush=True)
            if step > 0 or dt > args.slow_s:
                times[p].append((dt, dc))
            if dt > args.slow_s:
                slow.add(p)
    wall = {p: sum(w for w, _ in ts) / len(ts) for p, ts in times.items() if ts}
    cpu_s = {p: sum(c for _, c in ts) / len(ts) for p, ts in times.items() if ts}
    rows = [{"precision": p, "step_s": round(wall[p], 3), "cpu_s": round(cpu_s[p], 3), "steps": len(times[p]),
             "capped": p in slow, "vs_fp32": round(wall[p] / wall["fp32"], 3) if "fp32" in wall else None,
             "cpu_vs_fp32": round(cpu_s[p] / cpu_s["fp32"], 3) if "fp32" in cpu_s else None,
             "auto": p == choice.value} for p in precisions]
    Path(args.worker).write_text(json.dumps({
        "cpu": f"{cpu.model} ({cpu.label()})", "auto": choice.value, "auto_reason": choice.reason,
        "probe_fp32_ms": round(found.fp32_s * 1e3, 2), "probe_autocast_ms": round(found.autocast_s * 1e3, 2),
        "tokens_per_step": sum(len(s.prompt_ids) + len(s.completion_ids) for s in batch), "threads": args.threads,
        "load_avg": round(os.getloadavg()[0], 2), "rows": rows}))


def table(results: list[dict]) -> str:
    lines = ["| arm | CPU as torch sees it | precision | step s | vs fp32 | CPU s | CPU vs fp32 | auto | load |",
             "|---|---|---|---|---|---|---|---|---|"]

    def ratio(x: float | None) -> str:
        return f"{x:.2f}x" if x is not None else "-"

    for r in results:
        for row in r["rows"]:
            lines.append(f"| {r['arm']} | {r['cpu']} | {row['precision']} | {row['step_s']:.2f}{'*' if row['capped'] else ''} "
                         f"| {ratio(row['vs_fp32'])} | {row['cpu_s']:.2f} | {ratio(row['cpu_vs_fp32'])} "
                         f"| {'**auto**' if row['auto'] else ''} | {r['load_avg']:.1f} |")
    lines += [f"{r['arm']}: {r['auto_reason']}" for r in results]
    return "\n".join(lines)
