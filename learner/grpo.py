"""GRPO advantages and policy losses: pure tensor functions.

Reading order of an RL step: rollouts -> rewards -> :func:`group_advantages` -> per-token
log-probs (trainer) -> :func:`policy_loss` -> optimizer step.

Departures from the GRPO paper (Shao et al. 2024, DeepSeekMath), all deliberate:

1. **No KL penalty by default.** The paper adds ``beta * KL(pi_theta || pi_ref)`` per token.
   ``kl_coef`` defaults to 0 (as in DAPO, Dr. GRPO and most recent recipes): LoRA already keeps
   the policy near the base model, and the reference forward pass costs a full extra forward.
   With ``kl_coef > 0`` and ``ref_logp`` given, the paper's k3 estimator is used.
2. **Token-level averaging (DAPO).** The paper averages the per-token loss within each sequence,
   then over sequences, so tokens of long completions weigh less. Here the loss is the sum over
   all valid completion tokens of the batch divided by the batch's token count
   (``token_normalizer``), so every token weighs the same; the trainer passes the count of the
   whole batch to every micro-batch, so gradient accumulation gives the same gradient as one pass.
3. **Asymmetric clipping (DAPO "clip-higher").** ``clip_eps_low`` and ``clip_eps_high`` may differ
   (defaults 0.2 / 0.28).
4. **Behaviour log-probs come from another engine.** The "old policy" of the ratio is the
   behaviour policy that sampled the tokens: a quantised llama.cpp model on a node, possibly a few
   adapter versions old (asynchronous mode). Its log-probs differ from the learner's even at
   staleness 0 (up to ~0.5 nats per token with a Q4_1 base), so besides the paper's PPO clip
   (``ppo_clip``) two off-policy corrections are offered: truncated importance sampling
   (``tis``, verl/OpenRLHF) and the decoupled objective (``decoupled``, AReaL) with a proximal
   policy. The proximal policy is the learner's policy before the step: with one optimizer
   update per batch that is the current policy's own log-probs (detached, the default here);
   with several minibatch updates the trainer computes them once before the first update.
5. **Advantages use the population std** (``ddof=0``) of the group plus ``eps``; a group whose
   rewards are all equal gets exactly zero advantages (no signal, no noise). ``scale_by_std=False``
   gives the Dr. GRPO variant (mean-centred only): ``train.scale_rewards = "none"``.
6. **Log-ratios are clamped** to ``[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]`` before ``exp`` so a
   badly mismatched token cannot overflow; clipping/truncation makes this moot for the loss value
   except in the unclipped branch of negative-advantage tokens (which the clamp bounds).
"""

from __future__ import annotations

from typing import Sequence

import torch

from learner.config import LOSSES, LossKind  # train.loss: declared once, with the config

LOG_RATIO_CLAMP = 20.0
"""Log-ratios are clamped to +-this before exponentiation (exp(20) ~ 5e8)."""


def group_advantages(rewards: torch.Tensor | Sequence[float], eps: float = 1e-6,
                     scale_by_std: bool = True) -> torch.Tensor:
    """Advantages of one GRPO group.

    rewards: [G] rewards of the G completions of one prompt.
    returns: [G] float32, ``(r - mean(r)) / (std(r) + eps)`` with the population std
    (``ddof=0``; e.g. rewards (1, 0) give (+1, -1) up to eps). ``scale_by_std=False``
    returns ``r - mean(r)``. All-equal rewards give exactly zero.
    """
    r = torch.as_tensor(rewards, dtype=torch.float32).reshape(-1)  # [G]
    if r.numel() == 0:
        return r
    centred = r - r.mean()  # [G]
    if torch.all(r == r[0]):
        return torch.zeros_like(r)
    if not scale_by_std:
        return centred
    return centred / (r.std(unbiased=False) + eps)  # [G]


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    n = mask.sum()
    return float((x * mask).sum() / n) if n > 0 else 0.0


def policy_loss(
    logp: torch.Tensor,
    behav_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.28,
    kind: LossKind = "ppo_clip",
    *,
    prox_logp: torch.Tensor | None = None,
    is_cap: float = 2.0,
    token_normalizer: float | None = None,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level policy-gradient loss of one (micro-)batch.

    logp:       [N, T] log pi_theta(token) under the current policy (requires grad).
    behav_logp: [N, T] log pi_behav(token) reported by the node that sampled it.
    advantages: [N]    one advantage per sequence, broadcast over its tokens.
    mask:       [N, T] 1 for valid completion tokens, 0 for padding.
    kind:
      - ``ppo_clip``: ``-min(r A, clip(r, 1-eps_low, 1+eps_high) A)``, ``r = pi_theta/pi_behav``.
      - ``tis``: ``-min(pi_theta/pi_behav, is_cap).detach() * A * logp`` (truncated IS times
        the vanilla policy gradient).
      - ``decoupled``: ``-min(pi_prox/pi_behav, is_cap) * min(r A, clip(r) A)`` with
        ``r = pi_theta/pi_prox``; ``prox_logp`` [N, T] defaults to ``logp.detach()``.
    token_normalizer: divide the summed token loss by this (default: ``mask.sum()``). Pass the
      token count of the whole batch when accumulating gradients over micro-batches.
    ref_logp, kl_coef: optional k3 KL penalty to a reference policy (off by default).

    Returns ``(loss, stats)``; stats are means over this call's valid tokens (plus maxima):
    ``clip_frac`` (tokens whose gradient the clip/truncation removed or capped), ``ratio_mean``,
    ``ratio_max``, ``ratio_min`` (pi_theta/pi_behav), ``is_weight_mean`` (the truncated IS
    weight; 1 for ``ppo_clip``), ``mismatch_k3`` (k3 estimate of KL(pi_behav || pi_theta)),
    ``abs_logp_diff`` and ``tokens``.
    """
    if kind not in LOSSES:
        raise ValueError(f"kind must be one of {LOSSES}, got {kind!r}")
    mask = mask.to(logp.dtype)  # [N, T]
    adv = advantages.to(logp.dtype).reshape(-1, 1)  # [N, 1]
    behav_logp = behav_logp.to(logp.dtype)
    lo, hi = 1.0 - clip_eps_low, 1.0 + clip_eps_high

    log_ratio_behav = (logp - behav_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # [N, T]
    ratio_behav = torch.exp(log_ratio_behav)  # [N, T] pi_theta / pi_behav

    if kind == "ppo_clip":
        surr1 = ratio_behav * adv  # [N, T]
        surr2 = ratio_behav.clamp(lo, hi) * adv  # [N, T]
        token_loss = -torch.minimum(surr1, surr2)  # [N, T]
        clipped = (surr2 < surr1).to(logp.dtype)  # [N, T] gradient zeroed by the clip
        weight = torch.ones_like(logp)
    elif kind == "tis":
        raw_w = ratio_behav.detach()  # [N, T]
        weight = raw_w.clamp(max=is_cap)  # [N, T]
        token_loss = -weight * adv * logp  # [N, T]
        clipped = (raw_w > is_cap).to(logp.dtype)
    else:  # decoupled
        prox = logp.detach() if prox_logp is None else prox_logp.to(logp.dtype).detach()
        raw_w = torch.exp((prox - behav_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # [N, T]
        weight = raw_w.clamp(max=is_cap)  # [N, T] pi_prox / pi_behav, truncated
        ratio = torch.exp((logp - prox).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # [N, T]
        surr1 = ratio * adv
        surr2 = ratio.clamp(lo, hi) * adv
        token_loss = -weight * torch.minimum(surr1, surr2)  # [N, T]
        clipped = ((surr2 < surr1) | (raw_w > is_cap)).to(logp.dtype)

    if kl_coef > 0.0 and ref_logp is not None:
        d = (ref_logp.to(logp.dtype) - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        token_loss = token_loss + kl_coef * (torch.exp(d) - d - 1.0)  # k3 estimator, [N, T]

    n_tokens = mask.sum()
    denom = float(token_normalizer) if token_normalizer is not None else float(n_tokens.clamp(min=1.0))
    loss = (token_loss * mask).sum() / denom  # scalar

    with torch.no_grad():
        valid = mask > 0
        rb = ratio_behav.detach()
        neg_lr = -log_ratio_behav.detach()  # log pi_behav - log pi_theta
        stats = {
            "tokens": float(n_tokens),
            "clip_frac": _masked_mean(clipped, mask),
            "ratio_mean": _masked_mean(rb, mask),
            "ratio_max": float(rb[valid].max()) if bool(valid.any()) else 0.0,
            "ratio_min": float(rb[valid].min()) if bool(valid.any()) else 0.0,
            "is_weight_mean": _masked_mean(weight.detach(), mask),
            "mismatch_k3": _masked_mean(torch.exp(-neg_lr) - 1.0 + neg_lr, mask),
            "abs_logp_diff": _masked_mean(neg_lr.abs(), mask),
        }
    return loss, stats
