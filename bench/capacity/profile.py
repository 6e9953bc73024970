"""``swarm-bench profile``: measure this machine for the capacity planner and write a profile file.

Three short measurements (each bounded to tens of seconds):

- node generation, per installed node backend: whole GRPO groups of ``--group-size``
  completions of one prompt (the task's train prompts in turn with ``--task``, else one fixed
  word problem) (``--max-tokens`` each, temperature 1) for about ``--seconds``,
  after a short warm-up; other backends are skipped with the reason;
- the learner: one GRPO step of the peft trainer (``learner.loop.build_trainer``, the
  default learner config) on a synthetic batch of ``prompts_per_step x group_size`` samples
  with the measured completion length;
- verification: the learner re-scoring one group of those samples under its own weights
  (``learner.verify.Verifier``, as it checks a node's rollouts), ``verify_s`` per group;
- the adapter: the size of the exported LoRA (float32 as held, and float16 as it could be sent).

The profile is JSON (format ``echo-swarm-profile/1``)::

    workload: prompts_per_step, group_size, max_tokens, prompt_tokens   (what was measured)
    nodes:    {backend: {tokens_per_s, group_s, completion_tokens, completion_lengths, groups, threads, device}}
    skipped:  {backend: reason}
    learner:  {train_s, samples, tokens, prompt_tokens, threads, cpus, publish_s, verify_s}  (absent with --no-learner)
    adapter:  {bytes_fp32, bytes_fp16, tensors, rank, install_s: {backend: s}}     (absent with --no-learner)
    machine:  {cpu_count, platform}

Pinning (``--node-cpu``, ``--learner-cpu``): every thread of this process is moved to that core
before the measurement, so a profile taken with the cores a run will use (learner on one core,
nodes on another) predicts that run. ``publish_s`` is the learner's per-step work after the
optimizer step (export the adapter and encode it for the wire); ``install_s`` is a node
installing one new adapter version into its backend (conversion and load), per backend.

``tokens_per_s`` is generated tokens per wall second of whole groups; ``group_s`` is seconds
per group (the planner's group latency L); ``train_s`` is one optimizer step on the batch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

FORMAT = "echo-swarm-profile/1"
#: Backends the profiler knows how to ask for (only those in the node registry are tried).
CANDIDATE_BACKENDS = ("llamacpp", "torch", "mlx")
PROMPT = "A shop sells pencils at 3 dollars each. Tom buys 7 pencils and pays with 50 dollars. How much change does he get?"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="capacity-profile.json", help="profile file to write")
    parser.add_argument("--model", default="default", help="model name for nodes and learner ('default': SmolLM2-135M)")
    parser.add_argument("--prompts-per-step", type=int, default=8, help="GRPO groups per learner step")
    parser.add_argument("--group-size", type=int, default=8, help="completions per group")
    parser.add_argument("--max-tokens", type=int, default=64, help="max new tokens per completion")
    parser.add_argument("--seconds", type=float, default=20.0, help="generation time budget per backend")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads for generation and training (0: all cores)")
    parser.add_argument("--no-learner", action="store_true", help="skip the learner step and adapter size")
    parser.add_argument("--backends", default=",".join(CANDIDATE_BACKENDS),
                        help="comma-separated node backends to measure (default: all the profiler knows)")
    parser.add_argument("--task", default="arith",
                        help="take the prompts from this task's train split, as a run would ('' : one fixed prompt)")
    parser.add_argument("--node-cpu", type=int, help="pin generation to this CPU core (as the run will)")
    parser.add_argument("--learner-cpu", type=int, help="pin the learner step to this CPU core (as the run will)")


def pin_threads(cpus: set[int] | None, pid: int | str = "self") -> None:
    """Move every thread of process ``pid`` to ``cpus`` (``sched_setaffinity`` acts per thread,
    so the threads a process already has are moved one by one; new threads inherit it)."""
    if not cpus:
        return
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, PermissionError):
            pass  # a thread that ended meanwhile


def _chat(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def task_prompts(args: argparse.Namespace, n: int) -> list[list[int]] | None:
    """Token ids of the first ``n`` train prompts of ``args.task`` as the learner renders them."""
    if not args.task:
        return None
    from learner.config import LearnerConfig
    from swarm.config import with_values
    from learner.episodes import initial_prompt, run_task
    from learner.models import load_tokenizer
    from learner.models import resolve_model

    cfg = with_values(LearnerConfig(), {"task.name": args.task})
    task = run_task(cfg.task)
    tokenizer = load_tokenizer(resolve_model(args.model).hf_dir)
    return [initial_prompt(task, tokenizer, task.problem("train", i), False) for i in range(n)]


def profile_backend(name: str, args: argparse.Namespace, prompts: list[list[int]] | None = None) -> dict:
    """Generate groups for about ``args.seconds``; raises ImportError/ValueError if unavailable."""
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.registry import create_backend

    pin_threads({args.node_cpu} if args.node_cpu is not None else None)
    backend = create_backend(name, model=args.model, threads=args.threads)
    try:
        tokenize = getattr(backend, "tokenize", None)
        prompts = prompts or [tokenize(_chat(PROMPT)) if tokenize else list(range(10, 74))]
        prompt = prompts[0]
        backend.generate_group(prompt, min(2, args.group_size), SamplingParams(1.0, 1.0, 4, seed=0))  # warm-up
        groups = tokens = 0
        lengths: list[int] = []
        t0 = time.perf_counter()
        while groups == 0 or time.perf_counter() - t0 < args.seconds:
            prompt = prompts[groups % len(prompts)]
            comps = backend.generate_group(prompt, args.group_size, SamplingParams(1.0, 1.0, args.max_tokens, seed=groups))
            tokens += sum(len(c.token_ids) for c in comps)
            lengths += [len(c.token_ids) for c in comps]
            groups += 1
        elapsed = time.perf_counter() - t0
        caps = backend.capabilities()
    finally:
        backend.close()
    return {"tokens_per_s": tokens / elapsed, "group_s": elapsed / groups,
            "completion_tokens": tokens / (groups * args.group_size), "groups": groups,
            "completion_lengths": lengths[:256],
            "threads": args.threads or os.cpu_count() or 1, "device": caps.device,
            "prompt_tokens": sum(map(len, prompts)) / len(prompts)}


def profile_learner(args: argparse.Namespace, lengths: list[int], prompts: list[list[int]]) -> tuple[dict, dict]:
    """One timed GRPO step on a synthetic batch (the profiled prompts, completions of the
    profiled lengths drawn at random, so padding is as in a run); the exported adapter's size."""
    import numpy as np

    from learner.config import LearnerConfig
    from swarm.config import with_values
    from learner.trainer_build import build_trainer
    from learner.models import resolve_model
    from learner.trainer import TrainSample

    cfg = with_values(LearnerConfig(), {"model.name": args.model, "train.prompts_per_step": args.prompts_per_step,
                                        "train.group_size": args.group_size, "train.torch_threads": args.threads})
    pin_threads({args.learner_cpu} if args.learner_cpu is not None else None)
    trainer = build_trainer(resolve_model(args.model), cfg)
    rng = np.random.default_rng(0)
    vocab = int(trainer.model.get_base_model().config.vocab_size)
    batch = []
    for i in range(args.prompts_per_step):
        prompt = list(prompts[i % len(prompts)])
        adv = rng.standard_normal(args.group_size)
        for a in adv:
            c_len = max(1, int(rng.choice(lengths)))
            batch.append(TrainSample(prompt, rng.integers(10, vocab, c_len).tolist(), [-1.0] * c_len, float(a)))
    prompt_tokens = sum(len(b.prompt_ids) for b in batch) / len(batch)
    from swarm.proto.adapter import AdapterReply

    trainer.train_step(batch)  # the first step pays one-off costs (allocations, kernels)
    stats = trainer.train_step(batch)
    verify_s = profile_verify(trainer, batch[:args.group_size])
    t0 = time.perf_counter()
    adapter = trainer.export_adapter(1)
    AdapterReply.from_adapter(adapter)
    publish_s = time.perf_counter() - t0
    n_bytes = sum(int(t.nbytes) for t in adapter.tensors.values())
    learner = {"train_s": float(stats["step_time_s"]), "samples": len(batch),
               "tokens": sum(len(b.completion_ids) for b in batch),
               "prompt_tokens": prompt_tokens, "threads": args.threads or os.cpu_count() or 1,
               "cpus": sorted(os.sched_getaffinity(0)), "publish_s": publish_s, "verify_s": verify_s}
    return learner, {"bytes_fp32": n_bytes, "bytes_fp16": n_bytes // 2, "tensors": len(adapter.tensors),
                     "rank": adapter.rank, "_adapter": adapter}


def profile_verify(trainer, group: list) -> float:
    """Seconds the learner takes to re-score one group (the second of two: the first pays
    one-off costs), as ``learner.verify.Verifier`` checks a node's rollouts."""
    from learner.config import VerifyConfig
    from learner.verify import Verifier

    v = Verifier(trainer, VerifyConfig(), temperature=1.0, top_p=1.0, weights_version=0)
    prompt, completions = list(group[0].prompt_ids), [list(s.completion_ids) for s in group]
    v.rescore(prompt, completions, 0)
    t0 = time.perf_counter()
    v.rescore(prompt, completions, 0)
    return time.perf_counter() - t0


def profile_install(name: str, args: argparse.Namespace, adapter) -> float:
    """Seconds for a node of backend ``name`` to install one new adapter version (median of 3)."""
    from dataclasses import replace

    from node_agents.backends.registry import create_backend

    pin_threads({args.node_cpu} if args.node_cpu is not None else None)
    backend = create_backend(name, model=args.model, threads=args.threads)
    try:
        times = []
        for v in range(3):
            t0 = time.perf_counter()
            backend.set_adapter(replace(adapter, version=v + 1))
            times.append(time.perf_counter() - t0)
    finally:
        backend.close()
    return sorted(times)[1]


def run(args: argparse.Namespace) -> dict:
    from node_agents.backends.registry import BACKENDS

    prof: dict = {"format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "model": args.model,
                  "workload": {"prompts_per_step": args.prompts_per_step, "group_size": args.group_size,
                               "max_tokens": args.max_tokens},
                  "nodes": {}, "skipped": {}, "task": args.task,
                  "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(terse=True)}}
    prompts = task_prompts(args, 64)
    for name in [b.strip() for b in args.backends.split(",") if b.strip()]:
        if name not in BACKENDS:
            prof["skipped"][name] = "not available in this installation's node backends"
            print(f"profile: skipping backend {name}: not available")
            continue
        print(f"profile: generating with {name} for about {args.seconds:.0f} s ...")
        try:
            prof["nodes"][name] = r = profile_backend(name, args, prompts)
        except (ImportError, ValueError, RuntimeError, FileNotFoundError) as e:
            prof["skipped"][name] = f"{type(e).__name__}: {e}"
            print(f"profile: skipping backend {name}: {e}")
            continue
        print(f"profile:   {r['tokens_per_s']:.1f} tok/s, {r['group_s']:.2f} s per group of {args.group_size}, "
              f"{r['completion_tokens']:.1f} tokens per completion ({r['groups']} groups)")
    prompt_tokens = next((r["prompt_tokens"] for r in prof["nodes"].values()), 64)
    prof["workload"]["prompt_tokens"] = prompt_tokens
    if not args.no_learner:
        lengths = next((r["completion_lengths"] for r in prof["nodes"].values()), [args.max_tokens])
        vocab_prompts = prompts or [list(range(10, 10 + int(prompt_tokens)))]
        print(f"profile: one learner step on {args.prompts_per_step * args.group_size} samples ...")
        prof["learner"], prof["adapter"] = profile_learner(args, lengths, vocab_prompts)
        adapter = prof["adapter"].pop("_adapter")
        print(f"profile:   train_s {prof['learner']['train_s']:.2f} s, publish {prof['learner']['publish_s']:.2f} s, "
              f"verify {prof['learner']['verify_s']:.2f} s per group; "
              f"adapter {prof['adapter']['bytes_fp32'] / 1e6:.2f} MB fp32")
        prof["adapter"]["install_s"] = {}
        for name in prof["nodes"]:
            prof["adapter"]["install_s"][name] = s = profile_install(name, args, adapter)
            print(f"profile:   {name} installs a new adapter in {s:.2f} s")
    Path(args.out).write_text(json.dumps(prof, indent=1) + "\n")
    print(f"profile: wrote {args.out}")
    return prof


def load_profile(path: str | os.PathLike) -> dict:
    """Read and check a profile file (clear error on a wrong or incomplete one)."""
    try:
        prof = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read profile {path}: {e}") from e
    if not isinstance(prof, dict) or prof.get("format") != FORMAT:
        raise ValueError(f"{path}: not an {FORMAT} file")
    for key in ("workload", "nodes"):
        if not isinstance(prof.get(key), dict):
            raise ValueError(f"{path}: missing section {key!r}")
    return prof
