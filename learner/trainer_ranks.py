"""One trainer's share of a step on several ranks (scheme: :mod:`learner.distributed`).

:class:`RankShards` is a part of every :class:`learner.trainer.Trainer`: which samples this rank
trains, its forward/backward passes (kept in step with the other ranks under FSDP), the gradient
and statistics all-reduce, and the proximal log-probs computed shard by shard. With one rank
every call is the identity. Which process runs what (rank 0's wrapper, the followers' loop) is in
:mod:`learner.trainer_build`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from learner import distributed as D

#: micro-batching of a list of samples: indices per forward/backward pass
MicroBatcher = Callable[[Sequence[Any]], list[list[int]]]
#: per-sample log-probs of a list of samples under the current policy
LogProbs = Callable[[Sequence[Any]], list[np.ndarray]]


class RankShards:
    """This rank's share of a trainer's step. ``ctx`` None (or one rank): the whole batch, no collectives."""

    def __init__(self, ctx: D.DistContext | None, device: torch.device, fsdp: bool) -> None:
        self.ctx = ctx if ctx is not None and ctx.active else None
        self.device, self.fsdp = device, bool(fsdp) and self.ctx is not None

    @property
    def active(self) -> bool:
        return self.ctx is not None

    def local_indices(self, batch: Sequence[Any]) -> list[int]:
        """Indices of ``batch`` this rank trains (whole GRPO groups; all of them on one rank)."""
        if self.ctx is None:
            return list(range(len(batch)))
        return D.shard_groups(batch, self.ctx.rank, self.ctx.world)

    def collective_device(self) -> torch.device:
        return self.device if self.ctx is not None and self.ctx.backend == "nccl" else torch.device("cpu")

    def max_over_ranks(self, n: int) -> int:
        return D.max_over_ranks(self.ctx, n, self.collective_device()) if self.ctx is not None else n

    def passes(self, batch: Sequence[Any], local: list[int], micro_batches: MicroBatcher) -> list[tuple[list[Any], float]]:
        """(samples, loss scale) per forward/backward of this rank. Under FSDP every rank must run
        as many passes as the busiest one (each pass gathers the sharded base), so the others add
        zero-weighted passes over one sample."""
        sub = [batch[i] for i in local]
        out = [([sub[i] for i in idxs], 1.0) for idxs in (micro_batches(sub) if sub else [])]
        if self.fsdp:
            out += [([batch[0]], 0.0)] * (self.max_over_ranks(len(out)) - len(out))
        return out

    def reduce(self, params: Sequence[torch.Tensor], sums: dict[str, float], ratio_max: float,
               ratio_min: float) -> tuple[dict[str, float], float, float]:
        """Sum the LoRA gradients and the token-weighted statistics over ranks (max / min of the
        ratio extremes), so every rank steps on the single-rank gradient."""
        if self.ctx is None:
            return sums, ratio_max, ratio_min
        D.all_reduce_grads(self.ctx, params)
        sums, mx, mn = D.all_reduce_stats(self.ctx, sums, {"ratio_max": ratio_max}, {"ratio_min": ratio_min},
                                          self.collective_device())
        return sums, mx["ratio_max"], mn["ratio_min"]

    def prox_logprobs(self, batch: Sequence[Any], logprobs: LogProbs, micro_batches: MicroBatcher) -> dict[int, np.ndarray]:
        """Proximal log-probs (the policy before this learner step) per sample ``id``; with several
        ranks each computes its shard and they exchange the results."""
        if self.ctx is None:
            return {id(s): lp for s, lp in zip(batch, logprobs(batch))}
        local = self.local_indices(batch)
        padding = 0
        if self.fsdp:  # agree on the pass count first (see passes)
            mine_n = len(micro_batches([batch[i] for i in local])) if local else 0
            padding = self.max_over_ranks(mine_n) - mine_n
        mine = dict(zip(local, logprobs([batch[i] for i in local]))) if local else {}
        for _ in range(padding):
            logprobs([batch[0]])
        merged: dict[int, np.ndarray] = {}
        for part in D.all_gather_object(self.ctx, mine):
            merged.update(part)
        return {id(batch[i]): lp for i, lp in merged.items()}
