"""Samples to tensors: the training sample type, token counts and right-padded batches.

Split out of :mod:`learner.trainer` (which re-exports :class:`TrainSample` and
:func:`loss_tokens`); no model code here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch


@dataclass
class TrainSample:
    """One completion to train on (any object with these attributes will do)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    behav_logprobs: list[float]
    advantage: float
    loss_mask: list[int] | None = None
    """Multi-turn episodes: 1 on completion tokens the model sampled, 0 on tokens the environment
    appended (they are context only: no loss, not counted in the token normaliser). ``None`` =
    every completion token."""
    group_id: str = ""
    """The group the completion belongs to (the coordinator's id; empty when unknown)."""


def loss_tokens(sample: Any) -> int:
    """Completion tokens of ``sample`` that carry the loss (the 1s of its ``loss_mask``)."""
    mask = getattr(sample, "loss_mask", None)
    return int(sum(mask)) if mask else len(sample.completion_ids)


def as_train_samples(batch: Sequence[Any]) -> list[TrainSample]:
    """Plain :class:`TrainSample` copies of any sample-like objects (picklable, for other ranks)."""
    out = []
    for s in batch:
        mask = getattr(s, "loss_mask", None)
        out.append(TrainSample([int(x) for x in s.prompt_ids], [int(x) for x in s.completion_ids],
                               [float(x) for x in s.behav_logprobs], float(getattr(s, "advantage", 0.0)),
                               [int(x) for x in mask] if mask else None, str(getattr(s, "group_id", ""))))
    return out


def pad_samples(samples: Sequence[Any], device: torch.device) -> dict[str, torch.Tensor]:
    """Right-padded tensors of n samples (L = longest prompt+completion, T = longest completion)."""
    n = len(samples)
    lens = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
    L, T = max(lens), max(len(s.completion_ids) for s in samples)
    input_ids = torch.zeros(n, L, dtype=torch.long)  # [n, L] pad id 0: never attended to
    attn = torch.zeros(n, L, dtype=torch.long)  # [n, L]
    pos = torch.zeros(n, T, dtype=torch.long)  # [n, T] position whose logits predict token t
    targets = torch.zeros(n, T, dtype=torch.long)  # [n, T] completion token ids
    behav = torch.zeros(n, T, dtype=torch.float32)  # [n, T]
    mask = torch.zeros(n, T, dtype=torch.float32)  # [n, T] 1 on valid completion tokens
    loss_mask = torch.zeros(n, T, dtype=torch.float32)  # [n, T] 1 on model tokens (multi-turn: not env)
    adv = torch.zeros(n, dtype=torch.float32)  # [n]
    for i, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        if p == 0:
            raise ValueError("a sample needs at least one prompt token")
        if len(s.behav_logprobs) != c:
            raise ValueError(f"sample {i}: {c} completion tokens but {len(s.behav_logprobs)} behaviour log-probs")
        input_ids[i, :p + c] = torch.tensor(list(s.prompt_ids) + list(s.completion_ids), dtype=torch.long)
        attn[i, :p + c] = 1
        pos[i, :c] = torch.arange(p - 1, p + c - 1)
        targets[i, :c] = torch.tensor(list(s.completion_ids), dtype=torch.long)
        behav[i, :c] = torch.tensor(list(s.behav_logprobs), dtype=torch.float32)
        mask[i, :c] = 1.0
        lm = getattr(s, "loss_mask", None)
        if lm:
            if len(lm) != c:
                raise ValueError(f"sample {i}: {c} completion tokens but a loss mask of {len(lm)}")
            loss_mask[i, :c] = torch.tensor(list(lm), dtype=torch.float32)
        else:
            loss_mask[i, :c] = 1.0
        adv[i] = float(getattr(s, "advantage", 0.0))
    t = dict(input_ids=input_ids, attention_mask=attn, pos=pos, targets=targets, behav=behav, mask=mask,
             loss_mask=loss_mask, adv=adv)
    return {k: v.to(device) for k, v in t.items()}


def cpu_copy(x: Any) -> Any:
    """``x`` (tensors, possibly inside dicts, lists and tuples) detached and copied to the CPU."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().clone()
    if isinstance(x, dict):
        return {k: cpu_copy(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(cpu_copy(v) for v in x)
    return x
