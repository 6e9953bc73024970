"""Settings of :class:`learner.trainer.Trainer` (re-exported there): LoRA, AdamW, loss, compute."""

from __future__ import annotations

from dataclasses import dataclass

from learner.grpo import LossKind

ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoraConfig:
    """The LoRA adapter trained on the frozen base."""

    rank: int = 8
    """LoRA rank r."""
    alpha: float = 16.0
    """Scale numerator: the update is ``(alpha / rank) * B @ A``."""
    dropout: float = 0.0
    """LoRA dropout on the adapter input (0: deterministic log-probs)."""
    target_modules: tuple[str, ...] = ALL_PROJECTIONS
    """Module names to adapt (default: all 7 attention and MLP projections)."""


@dataclass
class OptimConfig:
    """AdamW on the LoRA parameters."""

    lr: float = 5e-5
    """Learning rate (constant)."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip (<= 0 disables)."""
    betas: tuple[float, float] = (0.9, 0.99)
    """Adam betas."""
    eps: float = 1e-8
    """Adam epsilon."""
    minibatches: int = 1
    """Optimizer updates per batch: the batch is split into this many minibatches (whole GRPO
    groups each) and each gets its own AdamW step (PPO-style; later minibatches are slightly
    off-policy, which the clipped ratio to the behaviour log-probs accounts for)."""


@dataclass
class LossConfig:
    """Which policy loss and its clip settings (see :mod:`learner.grpo`)."""

    kind: LossKind = "decoupled"
    """``ppo_clip``, ``tis`` or ``decoupled``."""
    clip_eps_low: float = 0.2
    """Lower PPO clip: ratio >= 1 - clip_eps_low."""
    clip_eps_high: float = 0.28
    """Upper PPO clip: ratio <= 1 + clip_eps_high."""
    is_cap: float = 2.0
    """Truncation C of the importance weight (tis, decoupled)."""


@dataclass
class ComputeConfig:
    """How the step is computed."""

    micro_batch_size: int = 8
    """Sequences per forward/backward; gradients accumulate over the batch."""
    bf16_autocast: bool = True
    """Run the forward under bfloat16 autocast (weights stay float32)."""
    temperature: float = 1.0
    """Sampling temperature of the nodes; logits are divided by it before the log-softmax."""
    torch_threads: int | None = None
    """``torch.set_num_threads`` (process-wide); None leaves torch's default."""
    device: str = "cpu"
    """Torch device of the model: ``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (CUDA when present)."""
    share_prompt: bool = True
    """Run a GRPO group's shared prompt once per micro-batch (KV cache repeated over the group;
    off under gradient checkpointing, which cannot keep a cache)."""
    base_dtype: str = "float32"
    """Storage dtype of the frozen base weights: ``float32`` or ``bfloat16`` (LoRA stays float32)."""
    grad_checkpointing: bool = False
    """Recompute each decoder layer in the backward pass (less activation memory, ~30% slower)."""
    memory_reserve: float = 0.2
    """Automatic micro-batch (``micro_batch_size=0``): fraction of the free memory kept back."""
    fsdp: bool = False
    """With several ranks: shard the frozen base over them with FSDP (bases too big for one GPU)."""
