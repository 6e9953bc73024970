"""``swarm-bench learner``: learner training tokens/s and peak memory by device, rank count and model size.

Each configuration (model x rank count) runs in fresh processes -- ``torchrun`` for several
ranks, so the measured path is the real one: rank 0 sends each batch to the others, every rank
trains its whole GRPO groups, the LoRA gradients are all-reduced. The batch is synthetic
(``--prompts`` groups of ``--group`` completions, ``--prompt-len`` + ``--completion-len`` tokens
each, random ids, off-policy behaviour log-probs). One warm-up step, then ``--steps`` timed
``train_step`` calls. Reported per configuration: the device, the precision, the micro-batch,
the mean step time, training tokens/s (prompt + completion tokens of the batch per second of
step time; the loss covers the completion tokens) and peak memory (CUDA: the allocator's
peak per rank; CPU: the peak resident set per rank, model included); the highest rank is shown.

The trainer is the one ``swarm-learner launch`` runs: built by
:func:`learner.trainer_build.build_trainer` from a :class:`learner.config.LearnerConfig` with the
learner's defaults; ``--device``, ``--precision``, ``--micro-batch``, ``--grad-checkpointing``
and ``--fsdp`` are shortcuts for its ``train`` fields, and ``--set train.X=...`` sets any other.

Models: ``default`` (the embedded SmolLM2-135M), a shape name such as ``qwen2.5-0.5b``,
``qwen2.5-1.5b``, ``qwen3-4b`` or ``FAMILY-SIZE`` (``qwen2-0.5b``; random weights,
:func:`common.random_model.random_model_dir`, generated once into the cache), or an HF directory. ``--node-backend`` also measures the torch node backend's
generation tokens/s (batched KV-cache decoding, LoRA installed) on the same device.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from learner import distributed as D
from learner.config import LearnerConfig
from learner.models import ResolvedModel, cache_root, resolve_model
from learner.placement import peak_memory_bytes
from learner.trainer_build import build_trainer, follower_loop
from swarm.config import load_config
from swarm.config_flags import Shortcut, add_shortcuts, shortcut_overrides

S = Shortcut
#: Shortcuts for the learner config's ``train`` fields (defaults: the learner's).
TRAIN_FLAGS = (S("--device", "train.device"), S("--precision", "train.precision"),
               S("--micro-batch", "train.micro_batch"),
               S("--grad-checkpointing", "train.grad_checkpointing", const=True),
               S("--fsdp", "train.fsdp", const=True))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", action="append", default=None, metavar="MODEL",
                        help="default, a shape (qwen2.5-0.5b, qwen2.5-1.5b, qwen3-4b, qwen2-0.5b, ...) or an HF directory; "
                             "repeatable (default: default)")
    parser.add_argument("--ranks", default="1", help="comma-separated rank counts, e.g. 1,2 (default 1)")
    add_shortcuts(parser, LearnerConfig, TRAIN_FLAGS)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="set any learner config field, e.g. --set train.lr=1e-4 (repeatable)")
    parser.add_argument("--prompts", type=int, default=4, help="GRPO groups per batch")
    parser.add_argument("--group", type=int, default=4, help="completions per group")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--completion-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads per rank (0: cores / ranks)")
    parser.add_argument("--node-backend", action="store_true",
                        help="also measure the torch node backend's generation tokens/s on the device")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows to this JSON file")
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)


def resolve_bench_model(spec: str) -> Path:
    """An HF directory for ``spec`` (see the module docstring)."""
    if spec == "default" or Path(spec).expanduser().exists():
        return resolve_model(spec).hf_dir
    from common.random_model import random_model_dir, shape_of

    try:
        shape_of(spec)
    except ValueError as e:
        raise SystemExit(f"swarm-bench learner: {e}") from None
    return random_model_dir(spec, console=lambda m: print(f"swarm-bench learner: {m}", flush=True))


def run(args: argparse.Namespace) -> None:
    if args.worker is not None:
        return _worker(args)
    rows = []
    for spec in args.model or ["default"]:
        model_dir = resolve_bench_model(spec)
        for ranks in [int(r) for r in str(args.ranks).split(",") if r.strip()]:
            print(f"swarm-bench learner: {spec} on {ranks} rank(s) ...", flush=True)
            row = _run_config(args, spec, model_dir, ranks)
            rows.append(row)
            print("  " + _fmt_row(row), flush=True)
    if args.node_backend:
        for spec in args.model or ["default"]:
            rows.append(_node_backend_row(args, spec, resolve_bench_model(spec)))
    print()
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


# -- one configuration ---------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_config(args: argparse.Namespace, spec: str, model_dir: Path, ranks: int) -> dict:
    threads = args.threads or max(1, (os.cpu_count() or 1) // ranks)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        fwd = ["--model", str(model_dir), "--prompts", str(args.prompts), "--group", str(args.group),
               "--prompt-len", str(args.prompt_len), "--completion-len", str(args.completion_len),
               "--steps", str(args.steps), "--threads", str(threads), "--worker", str(out)]
        for override in [*shortcut_overrides(args, TRAIN_FLAGS), *args.overrides]:
            fwd += ["--set", override]
        launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}",
                    "--master-addr=127.0.0.1", f"--master-port={_free_port()}", "-m", "bench.cli", "learner"]
        cmd = launcher + fwd if ranks > 1 else [sys.executable, "-m", "bench.cli", "learner"] + fwd
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        proc = subprocess.run(cmd, env=env)
        if proc.returncode != 0 or not out.is_file():
            raise SystemExit(f"swarm-bench learner: {spec} on {ranks} rank(s) failed (exit {proc.returncode})")
        row = json.loads(out.read_text())
    return {"model": spec, **row}


def synthetic_batch(vocab: int, prompts: int, group: int, prompt_len: int, completion_len: int, seed: int = 0):
    import torch

    from learner.trainer import TrainSample

    g = torch.Generator().manual_seed(seed)
    hi = min(vocab, 32000)
    batch = []
    for _ in range(prompts):
        prompt = torch.randint(3, hi, (prompt_len,), generator=g).tolist()
        adv = torch.randn(group, generator=g)
        adv = (adv - adv.mean()).tolist()
        for j in range(group):
            comp = torch.randint(3, hi, (completion_len,), generator=g).tolist()
            behav = (-1.0 - 4.0 * torch.rand(completion_len, generator=g)).tolist()
            batch.append(TrainSample(prompt, comp, behav, float(adv[j])))
    return batch


def _worker(args: argparse.Namespace) -> None:
    """One rank of one configuration (run by :func:`_run_config`): the learner's own trainer."""
    import torch

    cfg = load_config(LearnerConfig, None, [*args.overrides, f"train.torch_threads={args.threads}"])
    env = D.env_context()
    ctx = D.init(D.resolve_device(cfg.train.device, env.local_rank), timeout_s=1800)
    t0 = time.perf_counter()
    trainer = build_trainer(ResolvedModel("bench", None, Path(args.model[0])), cfg, ctx)  # rank 0: wrapped
    load_s = time.perf_counter() - t0
    params = sum(p.numel() for p in trainer.model.parameters())
    if ctx.is_main:
        print(f"  rank 0: {trainer.describe()}; loaded in {load_s:.1f} s", flush=True)
    if not ctx.is_main:
        follower_loop(trainer, ctx)
        peaks = D.all_gather_object(ctx, peak_memory_bytes(trainer.device))
        D.shutdown()
        return
    batch = synthetic_batch(trainer.shape.vocab, args.prompts, args.group, args.prompt_len, args.completion_len)
    mb = trainer.micro_batch_size([batch[i] for i in trainer.ranks.local_indices(batch)])  # rank 0's shard
    trainer.train_step(batch)  # warm-up
    times = []
    for i in range(args.steps):
        t = time.perf_counter()
        trainer.train_step(batch)
        times.append(time.perf_counter() - t)
        print(f"  step {i + 1}/{args.steps}: {times[-1]:.2f} s", flush=True)
    peaks = [peak_memory_bytes(trainer.device)]
    if ctx.active:
        trainer.stop_followers()
        peaks = D.all_gather_object(ctx, peaks[0])
        D.shutdown()
    tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in batch)
    step_s = sum(times) / len(times)
    dev_name = (torch.cuda.get_device_name(trainer.device) if trainer.device.type == "cuda"
                else f"cpu ({os.cpu_count()} cores)")
    row = {"kind": "learner", "device": dev_name, "ranks": ctx.world, "params_m": round(params / 1e6, 1),
           "precision": f"{trainer.base_dtype}{'+bf16 autocast' if trainer.bf16_autocast else ''}", "micro_batch": mb,
           "tokens_per_step": tokens, "step_s": round(step_s, 3), "tokens_per_s": round(tokens / step_s, 1),
           "peak_gib": round(max(peaks) / 2**30, 2), "steps": args.steps,
           "load_avg": round(os.getloadavg()[0], 2)}
    Path(args.worker).write_text(json.dumps(row))


def _node_backend_row(args: argparse.Namespace, spec: str, model_dir: Path) -> dict:
    """The torch node backend's generation tokens/s with a LoRA installed (in this process)."""
    import torch

    from node_agents.backends.base import SamplingParams
    from node_agents.backends.torch_backend import TorchBackend

    device = D.resolve_device(load_config(LearnerConfig, None, shortcut_overrides(args, TRAIN_FLAGS)).train.device, 0)
    be = TorchBackend(model_dir, device=device, threads=args.threads or (os.cpu_count() or 1))
    be.set_adapter(random_lora(model_dir))
    rng = torch.Generator().manual_seed(0)
    hi = min(be.n_vocab, 32000)
    prompt = torch.randint(3, hi, (args.prompt_len,), generator=rng).tolist()
    params = SamplingParams(temperature=1.0, max_tokens=args.completion_len, seed=0)
    be.generate_group(prompt, 2, SamplingParams(temperature=1.0, max_tokens=4, seed=0))  # warm-up
    t = time.perf_counter()
    comps = []
    for r in range(max(1, args.steps)):
        comps += be.generate_group(prompt, args.group * args.prompts, params)
    dt = time.perf_counter() - t
    n = sum(len(c.token_ids) for c in comps)
    dev_name = torch.cuda.get_device_name(be.device) if be.device.startswith("cuda") else f"cpu ({os.cpu_count()} cores)"
    be.close()
    return {"kind": "node-torch", "model": spec, "device": dev_name, "ranks": 1, "params_m": None,
            "precision": be.dtype, "micro_batch": args.group * args.prompts, "tokens_per_step": None,
            "step_s": None, "tokens_per_s": round(n / dt, 1), "peak_gib": None, "steps": args.steps,
            "load_avg": round(os.getloadavg()[0], 2)}


def random_lora(model_dir: Path, rank: int = 8):
    """A small random rank-``rank`` adapter on q and v of every layer of ``model_dir`` (the node
    backends' swap path is exercised; its values change the tokens, not the speed)."""
    import torch
    from transformers import AutoConfig

    from common.lora import LoraAdapter

    cfg = AutoConfig.from_pretrained(str(model_dir))
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    rng = torch.Generator().manual_seed(0)
    tensors = {}
    for i in range(cfg.num_hidden_layers):
        for proj, out_dim in (("q_proj", cfg.num_attention_heads * head_dim), ("v_proj", kv_heads * head_dim)):
            pre = f"base_model.model.model.layers.{i}.self_attn.{proj}"
            tensors[f"{pre}.lora_A.weight"] = (torch.randn(rank, cfg.hidden_size, generator=rng) * 0.01).numpy()
            tensors[f"{pre}.lora_B.weight"] = (torch.randn(out_dim, rank, generator=rng) * 0.01).numpy()
    return LoraAdapter(version=1, rank=rank, alpha=2.0 * rank, target_modules=["q_proj", "v_proj"], tensors=tensors)


# -- output --------------------------------------------------------------------------------------
COLUMNS = ("kind", "model", "device", "ranks", "params_m", "precision", "micro_batch", "tokens_per_step", "step_s",
           "tokens_per_s", "peak_gib", "load_avg")


def _fmt_row(row: dict) -> str:
    return ", ".join(f"{k} {row.get(k)}" for k in COLUMNS if row.get(k) is not None)


def table(rows: list[dict]) -> str:
    """A Markdown table of the rows."""
    head = "| " + " | ".join(COLUMNS) + " |"
    sep = "|" + "---|" * len(COLUMNS)
    body = ["| " + " | ".join("" if r.get(c) is None else str(r.get(c)) for c in COLUMNS) + " |" for r in rows]
    return "\n".join([head, sep, *body])
