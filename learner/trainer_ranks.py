"""The several-ranks half of :class:`learner.trainer.Trainer`: which samples this rank trains,
its micro-batches (kept in step with the other ranks under FSDP) and the proximal log-probs
computed shard by shard. See :mod:`learner.distributed` for the scheme."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch


class RankShardingMixin:
    """Mixed into the trainer; uses its ``dist``, ``device``, ``compute``, ``_micro_batches`` and
    ``logprobs``."""

    def _local_indices(self, batch: Sequence[Any]) -> list[int]:
        if self.dist is None:
            return list(range(len(batch)))
        from learner.distributed import shard_groups

        return shard_groups(batch, self.dist.rank, self.dist.world)

    def _collective_device(self) -> torch.device:
        return self.device if self.dist is not None and self.dist.backend == "nccl" else torch.device("cpu")

    def _rank_micro_batches(self, batch: Sequence[Any], local: list[int]) -> list[tuple[list[Any], float]]:
        """(samples, loss scale) per forward/backward of this rank. Under FSDP every rank must run
        as many passes as the busiest one (each pass gathers the sharded base), so the others add
        zero-weighted passes over one sample."""
        sub = [batch[i] for i in local]
        out = [([sub[i] for i in idxs], 1.0) for idxs in (self._micro_batches(sub) if sub else [])]
        if self.dist is not None and self.compute.fsdp:
            out += [([batch[0]], 0.0)] * (self._max_over_ranks(len(out)) - len(out))
        return out

    def _max_over_ranks(self, n: int) -> int:
        import torch.distributed as tdist

        t = torch.tensor([n], dtype=torch.long, device=self._collective_device())
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
        return int(t.item())

    def _prox_logprobs(self, batch: Sequence[Any]) -> dict[int, np.ndarray]:
        """Proximal log-probs (the policy before this learner step) per sample ``id``; with several
        ranks each computes its shard and they exchange the results."""
        if self.dist is None:
            return {id(s): lp for s, lp in zip(batch, self.logprobs(batch))}
        from learner.distributed import all_gather_object

        local = self._local_indices(batch)
        padding = 0
        if self.compute.fsdp:  # agree on the pass count first (see _rank_micro_batches)
            mine_n = len(self._micro_batches([batch[i] for i in local])) if local else 0
            padding = self._max_over_ranks(mine_n) - mine_n
        mine = dict(zip(local, self.logprobs([batch[i] for i in local]))) if local else {}
        for _ in range(padding):
            self.logprobs([batch[0]])
        merged: dict[int, np.ndarray] = {}
        for part in all_gather_object(self.dist, mine):
            merged.update(part)
        return {id(batch[i]): lp for i, lp in merged.items()}
