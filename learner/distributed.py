"""The learner on several ranks (``torchrun``): rank 0 runs the swarm, every rank trains.

- **Roles** (:mod:`learner.trainer_build`). Rank 0 runs :func:`learner.loop.run_learner` as a
  single learner does (libp2p host, coordinator, replay buffer, dissemination, checkpoints, adapter
  export) with its trainer wrapped in a ``RankZeroTrainer``. Every other rank runs
  ``follower_loop``: it opens no host and only trains.
- **Messages.** Before each training step rank 0 broadcasts the step's samples (and, once after
  start or resume, its full trainer state: LoRA weights, optimizer state, step) over a gloo
  group with ``broadcast_object_list``; gloo works on CPU and beside NCCL on GPUs.
- **Sharding.** Each optimizer update's batch is split into whole GRPO groups per rank
  (:func:`shard_groups`, balanced by tokens); each rank computes the loss of its shard,
  normalised by the token count of the *whole* batch, so the sum over ranks is the single-rank
  loss.
- **Gradients.** The LoRA gradients are summed over ranks in one flattened all-reduce (what DDP
  does for its buckets; the frozen base has no gradients); every rank then clips and steps the
  same AdamW on the same gradients, so all ranks hold the same adapter without a broadcast.
  With ``train.fsdp`` the base is sharded by FSDP, which reduces the gradients itself.
- **Checkpoints** are written by rank 0 alone and hold the full LoRA and optimizer state, so a
  run can resume with any rank count.

This module holds the process group, the pure sharding decision and the collectives, and knows
nothing of the trainer; torch is imported inside the collectives, so it stays light to import.
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

#: Environment variables torchrun sets for every rank.
ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass
class DistContext:
    """This process's place among the ranks (``world == 1``: no torch.distributed at all)."""

    #: Global rank (0 runs the swarm side).
    rank: int = 0
    #: Number of ranks.
    world: int = 1
    #: Rank on this machine (picks the GPU).
    local_rank: int = 0
    #: Backend of the gradient collectives (``gloo`` or ``nccl``).
    backend: str = "gloo"
    #: The gloo group for Python-object messages (samples, state); None until initialised.
    object_group: Any = field(default=None, repr=False)
    #: Started by torchrun: the process group is joined even by a single rank, so
    #: ``torchrun --nproc-per-node 1`` runs the distributed path (NCCL on a GPU) with one rank.
    launched: bool = False

    @property
    def active(self) -> bool:
        return self.world > 1 or self.launched

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_CURRENT = DistContext()


def env_context(environ: dict[str, str] | None = None) -> DistContext:
    """Rank, world size and local rank from torchrun's environment (defaults: one rank)."""
    env = os.environ if environ is None else environ
    try:
        rank, world, local = (int(env.get(k, d)) for k, d in zip(ENV_KEYS, ("0", "1", "0")))
    except ValueError as e:
        raise ValueError(f"bad torchrun environment: {e}") from None
    if world < 1 or not 0 <= rank < world or local < 0:
        raise ValueError(f"bad torchrun environment: RANK={rank} WORLD_SIZE={world} LOCAL_RANK={local}")
    return DistContext(rank=rank, world=world, local_rank=local, launched="RANK" in env and "WORLD_SIZE" in env)


def resolve_device(spec: str, local_rank: int = 0, cuda_available: bool | None = None) -> str:
    """``train.device`` -> a torch device string. ``auto`` picks CUDA when present; ``auto`` and
    ``cuda`` pick the rank's own GPU (``cuda:<local_rank>``); ``cuda:N`` is taken as given."""
    spec = (spec or "auto").strip().lower()
    if cuda_available is None:
        import torch

        cuda_available = bool(torch.cuda.is_available())
    if spec == "auto":
        return f"cuda:{local_rank}" if cuda_available else "cpu"
    if spec == "cpu":
        return "cpu"
    if spec == "cuda" or (spec.startswith("cuda:") and spec[5:].isdigit()):
        if not cuda_available:
            raise ValueError(f"train.device={spec!r} but torch sees no CUDA GPU (use auto or cpu)")
        return f"cuda:{local_rank}" if spec == "cuda" else spec
    raise ValueError(f"train.device must be auto, cpu, cuda or cuda:N, got {spec!r}")


def init(device: str, timeout_s: float = 3600.0, environ: dict[str, str] | None = None) -> DistContext:
    """Join the process group when launched by torchrun, with any number of ranks (NCCL for CUDA
    devices, gloo otherwise, plus a gloo group for object messages); a no-op otherwise.
    ``timeout_s`` bounds every collective, including a follower's wait for the next step."""
    global _CURRENT
    ctx = env_context(environ)
    if not ctx.active:
        _CURRENT = ctx
        return ctx
    import torch
    import torch.distributed as dist

    ctx.backend = "nccl" if device.startswith("cuda") else "gloo"
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    timeout = _dt.timedelta(seconds=float(timeout_s))
    if not dist.is_initialized():
        dist.init_process_group(backend=ctx.backend, timeout=timeout)
    ctx.object_group = dist.new_group(backend="gloo", timeout=timeout) if ctx.backend != "gloo" else None
    _CURRENT = ctx
    return ctx


def current() -> DistContext:
    """The context :func:`init` set up (one rank when it was not called)."""
    return _CURRENT


def shutdown() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# -- pure decisions ----------------------------------------------------------------------------
def shard_groups(batch: Sequence[Any], rank: int, world: int) -> list[int]:
    """Indices of ``batch`` that ``rank`` trains: whole prompt groups (samples sharing
    ``prompt_ids``), each group to the rank with the fewest tokens so far (largest groups first,
    ties to the lower rank), in batch order. Every rank computes the same partition."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} of {world}")
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, s in enumerate(batch):
        groups.setdefault(tuple(s.prompt_ids), []).append(i)
    tokens = {k: sum(len(batch[i].prompt_ids) + len(batch[i].completion_ids) for i in idx)
              for k, idx in groups.items()}
    order = sorted(groups, key=lambda k: (-tokens[k], groups[k][0]))
    load, owner = [0] * world, {}
    for k in order:
        r = min(range(world), key=lambda j: (load[j], j))
        owner[k] = r
        load[r] += tokens[k]
    return sorted(i for k, idx in groups.items() if owner[k] == rank for i in idx)


# -- collectives -------------------------------------------------------------------------------
def broadcast_object(ctx: DistContext, obj: Any = None) -> Any:
    """Rank 0 sends ``obj``; every rank returns it."""
    import torch.distributed as dist

    box = [obj if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0, group=ctx.object_group)
    return box[0]


def all_gather_object(ctx: DistContext, obj: Any) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * ctx.world
    dist.all_gather_object(out, obj, group=ctx.object_group)
    return out


def max_over_ranks(ctx: DistContext, n: int, device: Any) -> int:
    """The largest ``n`` of any rank (on the collective backend's ``device``)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([int(n)], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def all_reduce_grads(ctx: DistContext, params: Sequence[Any]) -> None:
    """Sum the gradients of ``params`` over ranks in one flattened buffer (missing grads = 0)."""
    import torch
    import torch.distributed as dist

    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1).to(torch.float32) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).to(p.dtype)
        offset += n


def all_reduce_stats(ctx: DistContext, sums: dict[str, float], maxima: dict[str, float],
                     minima: dict[str, float], device: Any) -> tuple[dict, dict, dict]:
    """Sum / max / min of per-rank statistics (float64 on the collective backend's device)."""
    import torch
    import torch.distributed as dist

    out = []
    for values, op in ((sums, dist.ReduceOp.SUM), (maxima, dist.ReduceOp.MAX), (minima, dist.ReduceOp.MIN)):
        keys = sorted(values)
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
        if keys:
            dist.all_reduce(t, op=op)
        out.append({k: float(v) for k, v in zip(keys, t.tolist())})
    return out[0], out[1], out[2]
