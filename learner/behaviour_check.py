"""How far the nodes' behaviour log-probs are from the learner's own recomputation, per backend.

With ``train.behaviour_check`` on, each step recomputes, in fp32 and before any update, the
log-prob of every sampled token under the learner's current policy, and reports the token-mean
``|behaviour - recomputed|`` for each node backend (``behav_diff_llamacpp`` ...). At staleness 0
(sequential mode) the two policies are the same adapter, so what remains is the backends'
numerical agreement with the learner (F32 llama.cpp, fp32 torch and MLX: about 1e-5); at
staleness > 0 it also includes the policy change since the rollout's version.
Multi-turn groups (with an environment-token mask) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np


@dataclass
class _Sample:
    prompt_ids: list[int]
    completion_ids: list[int]


def per_backend_abs_diff(behav: Sequence[np.ndarray], recomputed: Sequence[np.ndarray],
                         backends: Sequence[str]) -> dict[str, float]:
    """``{"behav_diff_<backend>": token-mean |behav - recomputed|}`` (pure)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for b, r, name in zip(behav, recomputed, backends, strict=True):
        b, r = np.asarray(b, np.float64), np.asarray(r, np.float64)
        if b.shape != r.shape:
            raise ValueError(f"behaviour {b.shape} and recomputed {r.shape} log-probs differ in length")
        sums[name] = sums.get(name, 0.0) + float(np.abs(b - r).sum())
        counts[name] = counts.get(name, 0) + b.size
    return {f"behav_diff_{k}": sums[k] / counts[k] for k in sorted(sums) if counts[k]}


def behaviour_diffs(trainer: Any, groups: Sequence[Any], node_backends: dict[str, str]) -> dict[str, float]:
    """:func:`per_backend_abs_diff` of the single-turn completions in ``groups`` (``CompletedGroup``)
    against ``trainer.logprobs(..., autocast=False)``."""
    samples, behav, names = [], [], []
    for g in groups:
        for c in g.result.completions:
            if c.mask:
                continue
            samples.append(_Sample(list(g.spec.prompt_ids), list(c.token_ids)))
            behav.append(np.asarray(c.logprobs, np.float64))
            names.append(node_backends.get(g.peer_id, "unknown"))
    if not samples:
        return {}
    return per_backend_abs_diff(behav, trainer.logprobs(samples, autocast=False), names)
