"""``swarm-bench gpu-check``: the learner and the torch node on a GPU, in one command that fits a
short lease of a bare GPU machine (default budget 450 s), each part in its own process.

1. ``trainer``: the learner's trainer (``build_trainer``, as ``swarm-learner launch`` builds it,
   micro-batch planned from free memory) on a synthetic GRPO batch of each model shape
   (``--shapes``: the default model, random Qwen2.5-0.5B and -1.5B shapes), once per precision
   setting (``auto``, ``bf16``, ``autocast``, ``fp32``): tokens/s trained, step time, peak GPU
   memory, finite loss; then the same batch on the machine's CPU (``auto``, one step) for the ratio.
2. ``node``: the torch node backend generating GRPO groups on the device against the same
   backend on the CPU (and llama.cpp where it and the default model are installed): tokens/s.
3. ``swarm``: a real learner and a real torch ``swarm-node`` process on the device over libp2p
   on 127.0.0.1 for ``--swarm-steps`` steps: did it train, did the node generate with the
   versions the learner published.
4. ``torchrun``: the same run with the learner under torchrun on one rank (the NCCL process group
   and the launcher's path), ``--torchrun-steps`` steps.
5. ``extra``: larger released shapes (``--extra-shapes``, random Qwen2.5-3B and -7B) with the
   ``auto`` precision while the budget and the GPU's memory allow.

Each part writes ``<out>/<part>.json`` (rows, checks, skips with their reasons, and the traceback
of whatever failed: the other parts still run); ``<out>/gpu-check.json`` holds them all with the
machine's description (``env``); the tables are printed at the end. Exit status 1 when a part
failed or timed out. ``--device cpu --shapes qwen2-tiny`` runs every part on the CPU in well
under a minute (the test suite does). How to run it on a lent GPU machine: ``bench/gpu_check.sh``
and "The learner on a GPU" in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.gpu_plan import (EXTRA_SHAPES, PARTS, PartResult, add_cpu_ratios, extra_fits_memory, fits, parse_list,
                            part_allowance, scaled_estimate, shape_of, status_of, summary_lines)

#: Seconds a worker process needs before it does anything (Python, torch, transformers imports).
WORKER_START_S = 8.0
#: Fewest seconds worth starting a worker with (its start-up and one short run).
MIN_RUN_S = 20.0
#: Most seconds the CPU reference of one shape may take (it is one step; more tells nothing new).
CPU_REF_MAX_S = 90.0
#: A worker's own deadline comes this long before its process is stopped, so it skips what does
#: not fit (and says so) rather than being killed mid-item.
DEADLINE_MARGIN_S = 5.0
PRECISIONS = "auto,bf16,autocast,fp32"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON results and the workers' logs")
    parser.add_argument("--work", type=Path, default=None,
                        help="folder for the models and the runs (default: the echo-swarm cache for models, a "
                             "temporary folder for runs)")
    parser.add_argument("--shapes", default="default,qwen2-0.5b,qwen2-1.5b",
                        help="model shapes for the trainer and the node: default, FAMILY-SIZE of make-model "
                             "(qwen2-0.5b, qwen2-tiny, ...) (default %(default)s)")
    parser.add_argument("--extra-shapes", default=",".join(EXTRA_SHAPES),
                        help="larger shapes tried last, auto precision only, while budget and memory allow "
                             "(default %(default)s; empty: none)")
    parser.add_argument("--precisions", default=PRECISIONS, help="train.precision settings (default %(default)s)")
    parser.add_argument("--parts", default="trainer,node,swarm,torchrun,extra", help="parts to run (default: all)")
    parser.add_argument("--budget-s", type=float, default=450.0, help="seconds for the whole check (default 450)")
    parser.add_argument("--steps", type=int, default=3, help="timed trainer steps on the device after a warm-up")
    parser.add_argument("--no-cpu-ref", action="store_true", help="skip the CPU reference runs")
    parser.add_argument("--prompts", type=int, default=4, help="GRPO groups per synthetic batch")
    parser.add_argument("--group", type=int, default=4, help="completions per group")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--completion-len", type=int, default=128)
    parser.add_argument("--gen-group", type=int, default=16, help="node: completions per generated group")
    parser.add_argument("--gen-tokens", type=int, default=64, help="node: tokens per completion")
    parser.add_argument("--swarm-model", default="default", help="the model of the swarm runs (a shape name)")
    parser.add_argument("--swarm-steps", type=int, default=3)
    parser.add_argument("--torchrun-steps", type=int, default=2)
    parser.add_argument("--swarm-tokens", type=int, default=32, help="max tokens per completion in the swarm runs")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads per process (0: all cores)")
    parser.add_argument("--default-skeleton", default="",
                        help="the default model's config and tokenizer (from gpu-wheels) for random weights of its "
                             "shape when its GGUF is not installed")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--spec", default="{}", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> None:
    if args.worker:
        from bench import gpu_parts, gpu_swarm

        workers = {**gpu_parts.WORKERS, **gpu_swarm.WORKERS}
        if args.worker not in workers:
            raise SystemExit(f"gpu-check: unknown worker {args.worker!r}")
        workers[args.worker](json.loads(args.spec))
        return
    try:
        check = GpuCheck(args)
    except ValueError as e:
        raise SystemExit(f"gpu-check: {e}") from None
    results = check.run()
    if any(r.status in ("failed", "timeout") for r in results):
        raise SystemExit(1)


class GpuCheck:
    """Runs the parts in order within the budget (see the module docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.out = Path(args.out)
        (self.out / "raw").mkdir(parents=True, exist_ok=True)
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        self.temp_work = args.work is None  # the runs' folders go with it at the end
        if args.work is not None:
            self.work = Path(args.work)
            self.models = self.work / "models"
        else:
            from common.model_cache import cache_root

            self.work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
            self.models = cache_root() / "bench-models"
        self.models.mkdir(parents=True, exist_ok=True)
        self.threads = args.threads or os.cpu_count() or 1
        self.parts = [p for p in parse_list(args.parts) if p in PARTS]
        if not parse_list(args.extra_shapes) and "extra" in self.parts:
            self.parts.remove("extra")  # nothing to try: it keeps no time back
        self.shapes = [shape_of(s) for s in parse_list(args.shapes)]
        self.env: dict[str, Any] = {}

    def left(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.t0)

    # -- one worker process ----------------------------------------------------------------------
    def worker(self, part: str, tag: str, spec: dict[str, Any], timeout_s: float) -> tuple[Any, dict, str, float]:
        """Run worker ``part`` with ``spec``; returns (exit code or ``timeout``, its result JSON,
        the tail of its log, seconds)."""
        result = self.out / "raw" / f"{tag}.json"
        result.unlink(missing_ok=True)
        spec = {**spec, "result": str(result)}
        log = self.out / "logs" / f"{tag}.log"
        cmd = [sys.executable, "-m", "bench.cli", "gpu-check", "--out", str(self.out), "--worker", part,
               "--spec", json.dumps(spec)]
        t = time.monotonic()
        print(f"gpu-check: {tag} (up to {timeout_s:.0f} s) ...", flush=True)
        with open(log, "w") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": str(self.threads)})
            try:
                rc: Any = proc.wait(timeout=max(1.0, timeout_s))
            except subprocess.TimeoutExpired:
                rc = "timeout"
                _kill_group(proc)
        seconds = time.monotonic() - t
        data = json.loads(result.read_text()) if result.is_file() else {}
        tail = log.read_text(errors="replace")[-3000:]
        print(f"gpu-check: {tag}: exit {rc} in {seconds:.0f} s", flush=True)
        return rc, data, tail, seconds

    def base_spec(self) -> dict[str, Any]:
        a = self.args
        return {"device": a.device, "threads": self.threads, "models_dir": str(self.models),
                "skeleton": a.default_skeleton, "work": str(self.work)}

    # -- the parts ---------------------------------------------------------------------------------
    def run(self) -> list[PartResult]:
        rc, data, tail, _ = self.worker("env", "env", self.base_spec(), 120)
        self.env = data.get("env", {"error": tail})
        print(f"gpu-check: {json.dumps(self.env)}", flush=True)
        if self.args.device.startswith("cuda") and not self.env.get("cuda_available"):
            self._write([])
            raise SystemExit(f"gpu-check: torch sees no CUDA GPU here ({self.env.get('torch', 'torch did not import')}); "
                             "--device cpu checks the same paths on the CPU")
        results = []
        for i, part in enumerate(self.parts):
            allowance, why = part_allowance(part, self.left(), self.args.budget_s, self.parts[i + 1:])
            res = PartResult(part, allowance_s=allowance)
            if why:
                res.skipped.append(why)
            else:
                t = time.monotonic()
                try:
                    getattr(self, f"part_{part}")(res, time.monotonic() + allowance)
                except Exception as e:  # noqa: BLE001 - the orchestrator's own error is recorded too
                    res.status, res.error = "failed", f"{type(e).__name__}: {e}"
                res.seconds = time.monotonic() - t
            results.append(res)
            (self.out / f"{part}.json").write_text(json.dumps(res.to_json(), indent=1, default=str))
        wall = self._write(results)
        print("\n".join(summary_lines(results, self.env)), flush=True)
        print(f"\ngpu-check: {wall:.0f} s of {self.args.budget_s:.0f} s; results in {self.out}", flush=True)
        if self.temp_work:
            shutil.rmtree(self.work, ignore_errors=True)
        return results

    def _write(self, results: list[PartResult]) -> float:
        """``<out>/gpu-check.json``: the machine, the budget and every part; returns the wall time."""
        wall = round(time.monotonic() - self.t0, 1)
        summary = {"env": self.env, "budget_s": self.args.budget_s, "wall_s": wall, "device": self.args.device,
                   "argv": sys.argv[1:], "parts": [r.to_json() for r in results]}
        (self.out / "gpu-check.json").write_text(json.dumps(summary, indent=1, default=str))
        return wall

    def _train_spec(self, shape: str, device: str, precisions: list[str], steps: int, reference: bool) -> dict:
        a = self.args
        return {**self.base_spec(), "model": shape, "device": device, "precisions": precisions, "steps": steps,
                "prompts": a.prompts, "group": a.group, "prompt_len": a.prompt_len, "completion_len": a.completion_len,
                "reference": reference}

    def _trainer_shapes(self, res: PartResult, deadline: float, shapes: list, precisions: list[str],
                        cpu_ref: bool, optional_shapes: bool = False) -> None:
        """Every shape on the device, smallest first, with the first one's CPU reference right after
        it (the ratio that matters most) and the other CPU references last, with what is left (one
        step each, at most ``CPU_REF_MAX_S``). A named shape starts while ``MIN_RUN_S`` is left;
        the later references and, with ``optional_shapes``, the shapes after the first are
        estimated from the last run of their kind and skipped when the estimate does not fit."""
        dev = [(shape, False) for shape in shapes]
        cpu = [(shape, True) for shape in shapes] if cpu_ref else []
        jobs = dev[:1] + cpu[:1] + dev[1:] + cpu[1:]
        errors: list[str] = []
        last: dict[bool, tuple[float, float]] = {}  # reference? -> (seconds, parameters)
        for shape, ref in jobs:
            left = deadline - time.monotonic()
            if ref:
                left = min(left, CPU_REF_MAX_S)
            # a named shape on the device starts whenever a worker can (it skips precisions itself);
            # the optional runs (references after the first, larger shapes) must fit their estimate
            optional = ref in last and (ref or optional_shapes)
            est = scaled_estimate(*last[ref], shape.params_m, WORKER_START_S) if optional else MIN_RUN_S
            ok, why = fits(est, left)
            where = " on the CPU" if ref else ""
            if not ok:
                res.skipped.append(f"{shape.name}{where}: {why}")
                continue
            device = "cpu" if ref else self.args.device
            spec = self._train_spec(shape.name, device, ["auto"] if ref else precisions,
                                    1 if ref else self.args.steps, ref)
            last[ref] = (self._trainer_run(res, spec, f"trainer-{shape.name}-{'cpu' if ref else self.args.device}",
                                           left, f"{shape.name}{where}", errors), shape.params_m)
        add_cpu_ratios(res.rows)
        res.error = "\n".join(errors)
        res.status = status_of(res.rows, res.error, timed_out=res.timed_out)

    def _trainer_run(self, res: PartResult, spec: dict, tag: str, left: float, what: str, errors: list[str]) -> float:
        spec["deadline"] = time.time() + left - DEADLINE_MARGIN_S  # the worker skips before the kill
        rc, data, tail, secs = self.worker("trainer", tag, spec, left)
        self._take_rows(res, data, rc, tail, what, errors)
        return secs

    def _take_rows(self, res: PartResult, data: dict, rc: Any, tail: str, what: str, errors: list[str]) -> None:
        res.rows += data.get("rows", [])
        if data.get("model_dir"):
            res.checks[f"model {data['model']}"] = f"{data.get('note', '')} ({data.get('make_s', 0)} s to prepare)"
        if rc == "timeout":
            res.timed_out = True
            res.skipped.append(f"{what}: stopped at its time limit (what it finished is in the rows)")
        elif rc != 0:
            errors.append(f"{what}: exit {rc} (its log: logs/, the tail in log_tails)")
        if rc != 0:
            res.log_tails[what] = tail[-2000:]

    def part_trainer(self, res: PartResult, deadline: float) -> None:
        cpu_ref = not self.args.no_cpu_ref and self.args.device != "cpu"
        self._trainer_shapes(res, deadline, self.shapes, parse_list(self.args.precisions), cpu_ref)

    def part_extra(self, res: PartResult, deadline: float) -> None:
        shapes = []
        for name in parse_list(self.args.extra_shapes):
            shape = shape_of(name)
            ok, why = extra_fits_memory(shape.params_m, int(self.env.get("gpu_memory_bytes", 0)))
            if ok:
                shapes.append(shape)
            else:
                res.skipped.append(f"{name}: {why}")
        if shapes:
            self._trainer_shapes(res, deadline, shapes, ["auto"], cpu_ref=False, optional_shapes=True)
        else:
            res.status = "skipped"

    def part_node(self, res: PartResult, deadline: float) -> None:
        a = self.args
        spec = {**self.base_spec(), "models": [s.name for s in self.shapes], "group": a.gen_group,
                "max_tokens": a.gen_tokens, "prompt_len": a.prompt_len, "reps": 1,
                "llamacpp": self.env.get("llama_cpp", "not installed") != "not installed"
                and self.env.get("default_gguf", "not installed") != "not installed",
                "deadline": time.time() + (deadline - time.monotonic()) - DEADLINE_MARGIN_S}
        if not spec["llamacpp"]:
            res.skipped.append("llama.cpp: needs llama-cpp-python and the default GGUF here "
                               f"(llama_cpp {self.env.get('llama_cpp')}, default model {self.env.get('default_gguf')})")
        rc, data, tail, _ = self.worker("node", f"node-{a.device}", spec, deadline - time.monotonic())
        errors: list[str] = []
        self._take_rows(res, data, rc, tail, "node", errors)
        for r in res.rows:
            r.setdefault("vs_cpu", None)
        cpu = {r["model"]: r["tokens_per_s"] for r in res.rows
               if r.get("backend") == "torch" and r.get("reference") and r.get("tokens_per_s")}
        for r in res.rows:
            if not r.get("reference") and r.get("tokens_per_s") and cpu.get(r.get("model")):
                r["vs_cpu"] = round(r["tokens_per_s"] / cpu[r["model"]], 1)
        res.error = "\n".join(errors)
        res.status = status_of(res.rows, res.error, timed_out=res.timed_out)

    def _swarm_spec(self, steps: int, timeout_s: float) -> dict[str, Any]:
        a = self.args
        return {**self.base_spec(), "model": a.swarm_model, "steps": steps, "prompts": 2, "group": 4,
                "max_tokens": a.swarm_tokens, "timeout_s": timeout_s}

    def _swarm(self, res: PartResult, deadline: float, part: str, steps: int) -> None:
        left = deadline - time.monotonic()
        spec = self._swarm_spec(steps, max(1.0, left - 15.0))  # the worker stops its processes itself first
        rc, data, tail, _ = self.worker(part, f"{part}-{self.args.device}", spec, left)
        res.checks = data.get("checks", {})
        for key in ("node_log_tail", "learner_log_tail"):
            if data.get(key):
                res.log_tails[key.replace("_log_tail", "")] = data[key]
        error = data.get("error", "")
        if rc not in (0, "timeout"):
            error += f"\nworker exit {rc}"
        if rc != 0:
            res.log_tails["worker"] = tail[-2000:]
        res.error = error.strip()
        res.timed_out = rc == "timeout"
        res.status = status_of([], res.error, bool(res.checks.get("ok")) or res.timed_out, res.timed_out)

    def part_swarm(self, res: PartResult, deadline: float) -> None:
        self._swarm(res, deadline, "swarm", self.args.swarm_steps)

    def part_torchrun(self, res: PartResult, deadline: float) -> None:
        self._swarm(res, deadline, "torchrun", self.args.torchrun_steps)


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop a timed-out worker and everything it started (its own session)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue
