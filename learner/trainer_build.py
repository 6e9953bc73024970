"""The trainer each learner process runs, built from the config in one way.

- :func:`build_trainer`, used by ``swarm-learner launch`` and ``demo`` (every rank), the
  benchmarks and the tools: the ``[train]`` and ``[lora]`` sections of
  :class:`learner.config.LearnerConfig` go to :class:`learner.trainer.Trainer` as they are (one
  set of defaults); on rank 0 of several the trainer is wrapped to feed the other ranks.
- :class:`RankZeroTrainer` (rank 0 of several) holds a trainer and sends each step's samples (and
  its state when it changed) to the other ranks first; :func:`follower_loop` (every other rank)
  receives them and trains its shard (:mod:`learner.distributed` has the scheme).

Light to import: torch, transformers and peft load only when a trainer is built or trains.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Sequence

from learner import distributed as D
from learner.config import LearnerConfig
from learner.models import ResolvedModel
from learner.trainer_api import TrainerAPI

if TYPE_CHECKING:  # torch
    from learner.step_check import StepChecks
    from learner.trainer import Trainer

log = logging.getLogger("echo_swarm.learner.distributed")


def build_trainer(resolved: ResolvedModel, cfg: LearnerConfig, dist: D.DistContext | None = None) -> TrainerAPI:
    """The ready trainer (heavy: loads the model): a :class:`learner.trainer.Trainer` for one rank
    and for followers, a :class:`RankZeroTrainer` holding one on rank 0 of
    several. ``dist``: this process's place among the ranks (default: what
    :func:`learner.distributed.init` set up, one rank when it was not called)."""
    from learner.trainer import Trainer  # torch, transformers, peft

    ctx = dist if dist is not None else D.current()
    return wrap_for_ranks(Trainer(resolved, cfg.train, cfg.lora, dist=ctx), ctx)


# -- roles -------------------------------------------------------------------------------------
class RankZeroTrainer:
    """Rank 0's trainer: the :class:`learner.trainer.Trainer` API, but each ``train_step`` first
    sends its samples (and the full state when it changed) to the other ranks."""

    def __init__(self, trainer: Any, ctx: D.DistContext) -> None:
        self.inner, self.ctx = trainer, ctx
        self._state_sent = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def sync_state(self) -> None:
        """Send rank 0's LoRA weights, optimizer state and step to every rank."""
        D.broadcast_object(self.ctx, {"kind": "state", "state": self.inner.state_dict()})
        self._state_sent = True

    def train_step(self, batch: Sequence[Any], checks: StepChecks | None = None) -> dict[str, float]:
        from learner.batching import as_train_samples  # torch

        if checks is not None:  # the loop makes in-step checks with one rank only (learner/loop.py)
            raise ValueError("in-step verification is for one rank; several ranks check after the ack")
        if not self._state_sent:
            self.sync_state()
        samples = as_train_samples(batch)
        D.broadcast_object(self.ctx, {"kind": "train", "samples": samples})
        return self.inner.train_step(samples)

    def load_checkpoint(self, path: Any) -> None:
        self.inner.load_checkpoint(path)
        self._state_sent = False

    def stop_followers(self) -> None:
        """Tell the other ranks the run is over (they return from :func:`follower_loop`)."""
        D.broadcast_object(self.ctx, {"kind": "stop"})


_RANK_ZERO: RankZeroTrainer | None = None


def wrap_for_ranks(trainer: Trainer, ctx: D.DistContext | None = None) -> TrainerAPI:
    """The trainer rank 0's loop should use: as is for one rank, else a :class:`RankZeroTrainer`
    (remembered for :func:`current_trainer`). Followers get the plain trainer."""
    global _RANK_ZERO
    ctx = ctx if ctx is not None else D.current()
    if not ctx.active or not ctx.is_main:
        return trainer
    _RANK_ZERO = RankZeroTrainer(trainer, ctx)
    return _RANK_ZERO


def current_trainer() -> RankZeroTrainer | None:
    """Rank 0's wrapped trainer once :func:`wrap_for_ranks` made it."""
    return _RANK_ZERO


def follower_loop(trainer: TrainerAPI, ctx: D.DistContext, console: Callable[[str], None] = print) -> int:
    """A rank other than 0: apply state messages and train each step's shard until ``stop``;
    returns the number of steps trained."""
    steps = 0
    while True:
        msg = D.broadcast_object(ctx)
        kind = msg.get("kind") if isinstance(msg, dict) else None
        if kind == "state":
            trainer.load_state_dict(msg["state"])
            log.info("rank %d: took rank 0's state at optimizer step %d", ctx.rank, trainer.step)
        elif kind == "train":
            trainer.train_step(msg["samples"])
            steps += 1
        elif kind == "stop":
            return steps
        else:
            raise RuntimeError(f"rank {ctx.rank}: unexpected message from rank 0: {kind!r}")
