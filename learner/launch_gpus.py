"""``swarm-learner launch --gpus N``: the learner on N ranks through ``torchrun``.

- ``--gpus N`` (N > 1) re-runs the same command under ``python -m torch.distributed.run
  --standalone --nproc-per-node N`` (:func:`torchrun_command`; with N = 1 it gives the same path on
  one rank, which ``swarm-bench gpu-check`` runs to prove NCCL and the launcher on one GPU); a user may equally call ``torchrun ... -m learner.cli launch
  ...`` themselves, e.g. on several machines with ``--nnodes``, ``--node-rank`` and
  ``--rdzv-endpoint``: every rank reads its place from torchrun's environment.
- Under torchrun, :func:`run_ranks` joins the process group (NCCL on GPUs, gloo on CPU), lets
  each machine's local rank 0 resolve (and if needed convert) the model before the others use
  the cache, then rank 0 runs the whole learner (:func:`learner.loop.run_learner`) and every
  other rank runs :func:`learner.trainer_build.follower_loop`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from learner import distributed as D
from learner.memory import SequenceTooLongError
from learner.models import resolve_model
from learner.trainer_build import build_trainer, current_trainer, follower_loop


def under_torchrun(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return "WORLD_SIZE" in env and "RANK" in env


def torchrun_command(gpus: int, argv: list[str], run_dir: Path, python: str = sys.executable) -> list[str]:
    """The command that runs ``swarm-learner`` ``argv`` on ``gpus`` local ranks: ``--gpus`` is
    dropped and the run directory is fixed (ranks must not each pick a timestamped one)."""
    if gpus < 1:
        raise ValueError("torchrun needs at least one rank")
    rest, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == "--gpus":
            skip = True
            continue
        if a.startswith("--gpus=") or a == "--run-dir" or a.startswith("--run-dir="):
            skip = a == "--run-dir"
            continue
        rest.append(a)
    return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
            "-m", "learner.cli", *rest, "--run-dir", str(run_dir)]


def spawn_torchrun(gpus: int, argv: list[str], run_dir: Path) -> int:
    """Run the learner on ``gpus`` local ranks and wait; returns torchrun's exit status."""
    cmd = torchrun_command(gpus, argv, run_dir)
    print(f"swarm-learner: starting {gpus} ranks: {' '.join(cmd[1:])}", flush=True)
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 130


def run_ranks(cfg: Any, run_dir: Path, resume: bool, run_learner_main: Callable[[], int],
              console: Callable[[str], None] = print) -> int:
    """This process's part of a several-rank run (see the module docstring). ``run_learner_main``
    runs the whole single-process learner; it is called on rank 0 only."""
    env = D.env_context()
    device = D.resolve_device(cfg.train.device, env.local_rank)
    ctx = D.init(device, cfg.train.dist_timeout_s)
    try:
        if env.local_rank == 0:  # convert/cache the model once per machine
            resolve_model(cfg.model.name, cfg.model.cache_dir or None, cfg.model.revision)
        _barrier(ctx)
        if ctx.is_main:
            console(f"learner: rank 0 of {ctx.world} ({ctx.backend}); rank 0 runs the swarm side")
            rc = run_learner_main()
            trainer = current_trainer()
            if rc == 0 and trainer is not None:  # on failure torchrun stops the other ranks
                trainer.stop_followers()
            return rc
        resolved = resolve_model(cfg.model.name, cfg.model.cache_dir or None, cfg.model.revision)
        follower = build_trainer(resolved, cfg, ctx)  # a follower's trainer is not wrapped
        console(f"learner rank {ctx.rank}/{ctx.world}: following rank 0 (no libp2p host); {follower.describe()}")
        try:
            steps = follower_loop(follower, ctx, console)
        except SequenceTooLongError as e:
            print(f"swarm-learner rank {ctx.rank}: training stopped: {e}", file=sys.stderr)
            return 2
        console(f"learner rank {ctx.rank}/{ctx.world}: done after {steps} steps")
        return 0
    finally:
        D.shutdown()


def _barrier(ctx: Any) -> None:
    import torch.distributed as dist

    dist.barrier(group=ctx.object_group)
