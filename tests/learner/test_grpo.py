"""GRPO advantages and policy losses on hand-computed small cases."""

from __future__ import annotations

import math

import pytest
import torch

from learner.grpo import group_advantages, policy_loss

LN = math.log


def test_advantages_two_outcomes():
    # rewards (1, 0, 0, 1): mean 0.5, population std 0.5 -> (+1, -1, -1, +1)
    a = group_advantages([1.0, 0.0, 0.0, 1.0], eps=0.0)
    assert torch.allclose(a, torch.tensor([1.0, -1.0, -1.0, 1.0]))


def test_advantages_hand_computed_with_eps():
    # rewards (0, 0, 0, 1): mean 0.25, std sqrt(0.1875) = 0.4330127
    std = math.sqrt(0.1875)
    a = group_advantages([0.0, 0.0, 0.0, 1.0], eps=1e-2)
    want = torch.tensor([-0.25, -0.25, -0.25, 0.75]) / (std + 1e-2)
    assert torch.allclose(a, want, atol=1e-6)
    assert abs(float(a.sum())) < 1e-6


def test_advantages_equal_rewards_are_zero():
    for r in ([1.0] * 8, [0.0] * 8, [0.3, 0.3]):
        a = group_advantages(r)
        assert torch.equal(a, torch.zeros(len(r)))
    assert group_advantages([]).numel() == 0


def test_advantages_without_std_scaling():
    a = group_advantages([1.0, 0.0, 0.5], scale_by_std=False)
    assert torch.allclose(a, torch.tensor([0.5, -0.5, 0.0]))


def _case():
    """2 sequences x 3 tokens; seq 0 has 3 tokens, seq 1 has 2 (last is padding).

    behaviour log-probs are log(0.5); current probs give ratios
      seq 0: 0.5 -> 1.0, 0.7 -> 1.4, 0.4 -> 0.8
      seq 1: 0.5 -> 1.0, 0.3 -> 0.6, (pad)
    """
    p = torch.tensor([[0.5, 0.7, 0.4], [0.5, 0.3, 0.9]])
    logp = torch.log(p).requires_grad_(True)
    behav = torch.full((2, 3), LN(0.5))
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    return logp, behav, adv, mask


def test_ppo_clip_hand_computed():
    logp, behav, adv, mask = _case()
    loss, st = policy_loss(logp, behav, adv, mask, 0.2, 0.2, "ppo_clip")
    # seq 0 (A=+1): min(r, clip(r)) = 1.0, min(1.4, 1.2) = 1.2 (clipped), min(0.8, 0.8) = 0.8
    # seq 1 (A=-1): min(-1, -1) = -1, min(-0.6, -0.8) = -0.8 (clipped)
    # loss = -(1.0 + 1.2 + 0.8 - 1.0 - 0.8) / 5 tokens = -0.24
    assert loss.item() == pytest.approx(-0.24, abs=1e-6)
    assert st["clip_frac"] == pytest.approx(2 / 5)
    assert st["ratio_mean"] == pytest.approx((1.0 + 1.4 + 0.8 + 1.0 + 0.6) / 5, abs=1e-6)
    assert st["ratio_max"] == pytest.approx(1.4, abs=1e-6)
    assert st["ratio_min"] == pytest.approx(0.6, abs=1e-6)
    assert st["tokens"] == 5
    loss.backward()
    # d loss / d logp = -A * r / n_tokens where unclipped, 0 where clipped or padded.
    want = torch.tensor([[-1.0, 0.0, -0.8], [1.0, 0.0, 0.0]]) / 5
    assert torch.allclose(logp.grad, want, atol=1e-6)


def test_ppo_clip_asymmetric_and_token_normalizer():
    logp, behav, adv, mask = _case()
    # clip_eps_high = 0.5: the 1.4 token is no longer clipped; normalise by 10 tokens.
    loss, st = policy_loss(logp, behav, adv, mask, 0.2, 0.5, "ppo_clip", token_normalizer=10.0)
    assert loss.item() == pytest.approx(-(1.0 + 1.4 + 0.8 - 1.0 - 0.8) / 10, abs=1e-6)
    assert st["clip_frac"] == pytest.approx(1 / 5)


def test_tis_hand_computed():
    logp, behav, adv, mask = _case()
    loss, st = policy_loss(logp, behav, adv, mask, kind="tis", is_cap=1.2)
    # weights min(r, 1.2): seq 0: 1.0, 1.2, 0.8; seq 1: 1.0, 0.6
    w = torch.tensor([[1.0, 1.2, 0.8], [1.0, 0.6, 0.0]])
    want_loss = -(w * torch.tensor([[1.0], [-1.0]]) * torch.log(torch.tensor([[0.5, 0.7, 0.4], [0.5, 0.3, 0.9]]))).sum() / 5
    assert loss.item() == pytest.approx(float(want_loss), abs=1e-6)
    assert st["clip_frac"] == pytest.approx(1 / 5)  # only the 1.4 weight was truncated
    assert st["is_weight_mean"] == pytest.approx((1.0 + 1.2 + 0.8 + 1.0 + 0.6) / 5, abs=1e-6)
    loss.backward()
    # gradient -A * w / n: positive advantage pushes log-probs up (negative gradient)
    assert torch.allclose(logp.grad, -w * torch.tensor([[1.0], [-1.0]]) / 5, atol=1e-6)


def test_decoupled_default_prox_equals_tis():
    logp, behav, adv, mask = _case()
    l1, _ = policy_loss(logp, behav, adv, mask, kind="decoupled", is_cap=1.2)
    l1.backward()
    g1 = logp.grad.clone()
    logp2, *_ = _case()
    l2, _ = policy_loss(logp2, behav, adv, mask, kind="tis", is_cap=1.2)
    l2.backward()
    assert torch.allclose(g1, logp2.grad, atol=1e-6)


def test_decoupled_with_stale_prox():
    # One token, behaviour prob 0.5, proximal prob 0.8 (weight 1.6 capped at 1.5), current 1.0
    # (ratio to prox 1.25 > 1 + 0.2 -> clipped for A > 0).
    logp = torch.log(torch.tensor([[1.0]])).requires_grad_(True)
    behav, prox = torch.log(torch.tensor([[0.5]])), torch.log(torch.tensor([[0.8]]))
    loss, st = policy_loss(logp, behav, torch.tensor([2.0]), torch.ones(1, 1), 0.2, 0.2, "decoupled",
                           prox_logp=prox, is_cap=1.5)
    assert loss.item() == pytest.approx(-1.5 * 1.2 * 2.0, abs=1e-5)
    assert st["clip_frac"] == 1.0 and st["is_weight_mean"] == pytest.approx(1.5)
    loss.backward()
    assert float(logp.grad) == 0.0
    # Negative advantage, same ratio: unclipped branch -> gradient -w*A*r = -1.5*(-2)*1.25 = 3.75
    logp = torch.log(torch.tensor([[1.0]])).requires_grad_(True)
    loss, _ = policy_loss(logp, behav, torch.tensor([-2.0]), torch.ones(1, 1), 0.2, 0.2, "decoupled",
                          prox_logp=prox, is_cap=1.5)
    loss.backward()
    assert float(logp.grad) == pytest.approx(3.75, abs=1e-5)


def test_kl_penalty_zero_at_reference_and_positive_elsewhere():
    logp, behav, adv, mask = _case()
    base, _ = policy_loss(logp, behav, adv, mask, kind="tis")
    same, _ = policy_loss(logp, behav, adv, mask, kind="tis", ref_logp=logp.detach(), kl_coef=0.1)
    assert same.item() == pytest.approx(base.item(), abs=1e-7)
    other, _ = policy_loss(logp, behav, adv, mask, kind="tis", ref_logp=logp.detach() - 0.3, kl_coef=0.1)
    assert other.item() > base.item()


def test_padding_ignored_and_bad_kind():
    logp, behav, adv, mask = _case()
    l1, _ = policy_loss(logp, behav, adv, mask)
    logp2 = logp.detach().clone()
    logp2[1, 2] = 50.0  # garbage in a padded slot
    l2, _ = policy_loss(logp2, behav, adv, mask)
    assert l1.item() == pytest.approx(l2.item())
    with pytest.raises(ValueError):
        policy_loss(logp, behav, adv, mask, kind="reinforce")  # type: ignore[arg-type]


def test_scale_rewards_reaches_the_advantages():
    """``train.scale_rewards``: ``group`` divides by the group's std (GRPO), ``none`` only centres
    (Dr. GRPO); the config's value is what the step passes (``learner/steps.py``)."""
    from learner.config import LearnerConfig
    from learner.scoring import finite_advantages
    from swarm.config import load_config

    rewards = [1.0, 0.0, 0.0, 0.0]
    assert finite_advantages(rewards, scale_by_std=False) == pytest.approx([0.75, -0.25, -0.25, -0.25])
    scaled = finite_advantages(rewards)
    assert scaled[0] == pytest.approx(0.75 / 0.4330127, rel=1e-4)
    assert LearnerConfig().train.scale_rewards == "group"
    assert load_config(LearnerConfig, None, ['train.scale_rewards="none"']).train.scale_rewards == "none"
