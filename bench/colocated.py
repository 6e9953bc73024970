"""A co-located GRPO trainer (one process, torch generation then torch training) as the
baseline for the swarm: same task, seed, batch, sampling and optimiser as the learner config.

Each step: the current adapter is installed into a torch generation model (the node torch
backend: batched KV-cache decoding of each group, same seeded sampler), the groups are
generated, rewards computed with ``tasks/``, and the learner's :class:`~learner.trainer.Trainer`
takes its step. Generation and training alternate on the same cores, as in a single-machine
GRPO trainer. Writes ``metrics.jsonl`` (same fields as the learner's) to ``--out`` and
prints when the rolling 5-step mean first reaches ``--target``. With ``--swarm RUN_DIR`` it
prints the same figures for a swarm run (e.g. ``swarm-learner demo``) next to it.

``--baseline trl`` runs the swarm demo and then TRL's ``GRPOTrainer`` instead, and compares
time to accuracy and held-out accuracy at equal wall-clock (``bench/time_to_accuracy.py``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from types import SimpleNamespace


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bench.time_to_accuracy import add_trl_arguments

    p.add_argument("--baseline", choices=("torch", "trl"), default="torch",
                   help="torch: this module's co-located trainer; trl: the swarm demo, then TRL's GRPOTrainer")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=0.8, help="rolling-mean reward to time")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = all cores)")
    p.add_argument("--out", type=Path, default=None, help="output dir (default runs/colocated-<time>)")
    p.add_argument("--swarm", type=Path, default=None, help="a swarm run dir to compare against")
    p.add_argument("--config", type=Path, default=None, help="learner TOML config (default: built-in defaults)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    add_trl_arguments(p)


def describe(name: str, rows: list[dict], target: float) -> str:
    from learner.metrics import first_reaching, rolling_mean

    if not rows:
        return f"{name}: no steps"
    hit = first_reaching(rows, target)
    rewards = [r["reward_mean"] for r in rows]
    k = min(5, len(rows))
    when = (f"rolling5 reached {target} at step {hit['step']}, {hit['wall_s']:.0f}s, {hit['samples']} samples"
            if hit else f"rolling5 never reached {target} (max {max(rolling_mean(rewards)):.3f})")
    return (f"{name}: {len(rows)} steps in {rows[-1]['wall_s']:.0f}s; first5 {sum(rewards[:k]) / k:.3f} "
            f"last5 {sum(rewards[-k:]) / k:.3f}; {when}")


def run(args) -> int | None:
    if args.baseline == "trl":
        from bench.time_to_accuracy import run_vs_trl

        return run_vs_trl(args)
    import torch

    from learner.cli import validate
    from learner.config import LearnerConfig
    from learner.trainer_build import build_trainer
    from learner.models import load_tokenizer
    from learner.scoring import rewards_and_advantages
    from learner.metrics import MetricsWriter, progress_line, read_metrics, rolling_mean
    from learner.models import resolve_model
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.torch_backend import TorchBackend
    from swarm.config import load_config, with_values
    from swarm.proto.rollouts import Completion, GroupResult
    from swarm.proto.work import group_seed
    from tasks.registry import make_task

    cfg = validate(load_config(LearnerConfig, args.config,
                               [f"task.seed={args.seed}", f"train.seed={args.seed}", f"train.steps={args.steps}",
                                *args.overrides]))
    threads = args.threads or (torch.get_num_threads() if not cfg.train.torch_threads else cfg.train.torch_threads)
    cfg = with_values(cfg, {"train.torch_threads": threads})
    t = cfg.train
    out = args.out or Path("runs") / f"colocated-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    resolved = resolve_model(cfg.model.name, cfg.model.cache_dir or None, cfg.model.revision)
    trainer = build_trainer(resolved, cfg)
    tokenizer = load_tokenizer(resolved.hf_dir)
    gen = TorchBackend(resolved.hf_dir, threads=threads, max_group=t.group_size)
    task = make_task(cfg.task)
    metrics = MetricsWriter(out)
    print(f"colocated: torch generation + training in one process, {threads} threads; out {out}", flush=True)
    t_start = time.perf_counter()
    for step in range(t.steps):
        t0 = time.perf_counter()
        gen.set_adapter(trainer.export_adapter(step))
        groups = []
        for idx in range(step * t.prompts_per_step, (step + 1) * t.prompts_per_step):
            prompt = task.render_prompt(tokenizer, task.problem("train", idx))
            params = SamplingParams(t.temperature, t.top_p, t.max_tokens, group_seed(t.seed, f"g{idx}"))
            comps = gen.generate_group(prompt, t.group_size, params)
            result = GroupResult(f"g{idx}", step, [Completion(c.token_ids, c.logprobs, c.finish_reason) for c in comps])
            groups.append(SimpleNamespace(spec=SimpleNamespace(prompt_ids=prompt, problem_ref=str(idx)), result=result))
        gen_s = time.perf_counter() - t0
        samples, rewards = rewards_and_advantages(groups, task, tokenizer)
        t1 = time.perf_counter()
        stats = trainer.train_step(samples)
        train_s = time.perf_counter() - t1
        row = {"step": step + 1, "policy_version": step + 1, "reward_mean": sum(rewards) / len(rewards),
               "samples": len(rewards), "step_time_s": round(time.perf_counter() - t0, 3),
               "learner_idle_s": round(gen_s, 3), "gen_wait_s": round(gen_s, 3), "train_s": round(train_s, 3),
               "clip_frac": stats["clip_frac"], "nodes": {}, "wall_s": round(time.perf_counter() - t_start, 2)}
        metrics.write(row)
        print(progress_line(row, t.steps, rolling_mean(metrics.rewards())[-1]), flush=True)
    gen.close()
    print(describe("colocated", metrics.rows, args.target))
    if args.swarm is not None:
        print(describe(f"swarm ({args.swarm})", read_metrics(args.swarm / "metrics.jsonl"), args.target))
