"""Run by ``torchrun`` from test_distributed.py (not collected by pytest): train a fixed batch on
this rank count, optionally resuming from a checkpoint, and write every rank's adapter."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from learner import distributed as D
from learner.config import LoraSettings, TrainConfig
from learner.models import ResolvedModel
from learner.trainer import Trainer, TrainSample
from learner.trainer_build import follower_loop, wrap_for_ranks


UPDATES = 2  # optimizer updates (minibatches) per train_step


def fixed_batch(vocab: int) -> list[TrainSample]:
    """5 prompt groups of unequal sizes and lengths, off-policy behaviour log-probs."""
    g = torch.Generator().manual_seed(7)
    out = []
    for k, (size, plen) in enumerate([(3, 5), (2, 9), (4, 3), (2, 6), (3, 4)]):
        prompt = torch.randint(3, vocab, (plen,), generator=g).tolist()
        for j in range(size):
            c = 2 + (k + j) % 4
            comp = torch.randint(3, vocab, (c,), generator=g).tolist()
            behav = (-0.5 - 4 * torch.rand(c, generator=g)).tolist()
            out.append(TrainSample(prompt, comp, behav, float(torch.randn(1, generator=g))))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--resume", type=Path, default=None)
    ap.add_argument("--save-at", type=int, default=0, help="write a checkpoint after this many steps")
    ap.add_argument("--fsdp", action="store_true", help="shard the frozen base with FSDP")
    ap.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing")
    ap.add_argument("--skip-allreduce", action="store_true", help="negative control: no gradient all-reduce")
    a = ap.parse_args()
    ctx = D.init("cpu", timeout_s=120)
    if a.skip_allreduce:
        D.all_reduce_grads = lambda ctx, params: None
    tr = Trainer(ResolvedModel("tiny", None, a.model),
                 TrainConfig(lr=1e-2, minibatches=UPDATES, loss="decoupled", is_cap=2.0, micro_batch=4, precision="fp32",
                             device="cpu", torch_threads=1, fsdp=a.fsdp, grad_checkpointing=a.grad_ckpt, seed=0),
                 LoraSettings(rank=4, alpha=8), dist=ctx)
    a.out.mkdir(parents=True, exist_ok=True)
    if ctx.is_main:
        trainer = wrap_for_ranks(tr)
        if a.resume is not None:
            trainer.load_checkpoint(a.resume)
        batch = fixed_batch(int(tr.model.get_base_model().config.vocab_size))
        while trainer.step < UPDATES * a.steps:  # trainer.step counts optimizer updates
            stats = trainer.train_step(batch)
            print(f"step {trainer.step // UPDATES} loss {stats['loss']:.6f} tokens {stats['tokens']:.0f}", flush=True)
            if trainer.step == UPDATES * a.save_at:
                trainer.save_checkpoint(a.out / f"step{a.save_at}.pt")
        if ctx.active:
            trainer.stop_followers()
    else:
        print(f"rank {ctx.rank}: trained {follower_loop(tr, ctx)} steps", flush=True)
    torch.save({k: torch.from_numpy(v) for k, v in tr.export_adapter(0).tensors.items()},
               a.out / f"adapter_rank{ctx.rank}.pt")
    D.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
