"""The learner's run: model, trainer, service and host set up once, then one step per version.

The steps themselves (sequential pull or async push-pull) are in :mod:`learner.steps`. In both,
rewards are recomputed with ``tasks/`` (a node's reward is never trusted); leases of dead
nodes expire and are re-issued by the service; every prompt group is accounted for in the
coordinator's ledger (trained, dropped with a reason, or still pending) written to
``ledger.json`` at the end, with per-node figures in ``swarm.json``.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import trio

from learner.buffer import ReplayBuffer
from learner.config import LearnerConfig
from learner.coordinator import CompletedGroup, Coordinator, Limits
from learner.metrics import MetricsWriter, plot_rewards, progress_line, rolling_mean
from learner.pipelines import pipeline_settings
from learner.dissem import start_learner_dissem
from learner.publish import adapter_reply
from learner.service import LearnerService, SamplingDefaults
from learner.steps import async_step, sequential_step
from swarm.config import dump_toml, to_dict

log = logging.getLogger("echo_swarm.learner")

#: After the last step, the longest wait for active nodes to hear "done" before the host closes.
SHUTDOWN_GRACE_S = 20.0


@dataclass
class LoopState:
    """What a checkpoint needs besides the trainer's own state."""

    step: int = 0
    version: int = 0
    next_problem: int = 0
    wall_s: float = 0.0


@dataclass
class StepContext:
    """Everything a step function (:mod:`learner.steps`) works with."""

    cfg: LearnerConfig
    state: LoopState
    coord: Coordinator
    service: LearnerService
    trainer: object
    task: object
    tokenizer: object
    console: Callable[[str], None]
    #: Times the last published version's dissemination (``learner.step_timing``); None = not timed.
    dissem_watch: object = None


def build_trainer(resolved, cfg: LearnerConfig):
    """The peft/GRPO trainer from the learner config (heavy: loads the model)."""
    from learner.distributed import current, resolve_device
    from learner.placement import resolve_precision
    from learner.trainer import ComputeConfig, LoraConfig, LossConfig, OptimConfig, Trainer

    t, lo = cfg.train, cfg.lora
    dist = current()
    device = resolve_device(t.device, dist.local_rank)
    base_dtype, autocast = resolve_precision(t.precision, device)
    return Trainer(
        resolved,
        lora=LoraConfig(rank=lo.rank, alpha=lo.alpha, target_modules=tuple(lo.target_modules)),
        optim=OptimConfig(lr=t.lr, weight_decay=t.weight_decay, max_grad_norm=t.max_grad_norm,
                          minibatches=t.minibatches),
        loss=LossConfig(kind=t.loss, clip_eps_low=t.clip_low, clip_eps_high=t.clip_high, is_cap=t.is_cap),
        compute=ComputeConfig(micro_batch_size=t.micro_batch, temperature=t.temperature,
                              torch_threads=t.torch_threads or None, device=device, base_dtype=base_dtype,
                              bf16_autocast=autocast, grad_checkpointing=t.grad_checkpointing, fsdp=t.fsdp),
        seed=t.seed,
        dist=dist,
    )


def score_groups(groups: list[CompletedGroup], task, tokenizer) -> tuple[list, list[float]]:
    """Rewards recomputed from the tokens -> per-completion samples with GRPO advantages."""
    from learner.grpo import group_advantages
    from learner.trainer import TrainSample

    samples: list = []
    all_rewards: list[float] = []
    for g in groups:
        if any(c.mask for c in g.result.completions):  # multi-turn episodes (learner/episodes.py)
            from learner.episodes import score_episode_group

            more, rewards = score_episode_group(g, task, tokenizer)
            samples += more
            all_rewards += rewards
            continue
        problem = task.problem("train", int(g.spec.problem_ref))
        texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in g.result.completions]
        rewards = [float(task.reward(problem, t)) for t in texts]
        adv = group_advantages(rewards).tolist()
        for c, a in zip(g.result.completions, adv):
            samples.append(TrainSample(g.spec.prompt_ids, c.token_ids, c.logprobs, float(a)))
        all_rewards += rewards
    return samples, all_rewards


def load_tokenizer(hf_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(hf_dir))


async def run_learner(
    cfg: LearnerConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    console: Callable[[str], None] = print,
    on_service: Callable[[LearnerService], None] | None = None,
    data_dir: Path | None = None,
    task_status=trio.TASK_STATUS_IGNORED,
) -> list[dict]:
    """Run the whole training job; ``task_status.started(addrs)`` once nodes can join.
    ``on_service`` receives the live service (tests and tools watch its coordinator).
    ``data_dir`` keeps the learner's key (same peer id every launch; ``swarm-learner launch``
    passes ``--data-dir``); None = ``run_dir/identity`` (one identity per run dir)."""
    from learner.checkpoint import load_open_problems, load_state, open_problem_refs, reissue_specs, run_identity, save_state
    from learner.models import resolve_model
    from swarm.host import HostConfig, open_host
    from learner.episodes import episode_settings, make_verifier, run_task

    from learner.identity import announce_run, join_swarm, keep_peers, run_name
    from swarm.discovery.dht import open_discovery

    name = run_name(cfg)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(dump_toml(to_dict(cfg)))
    console(f"learner: loading model {cfg.model.name!r} ...")
    resolved = await trio.to_thread.run_sync(resolve_model, cfg.model.name, cfg.model.cache_dir or None)
    trainer = await trio.to_thread.run_sync(build_trainer, resolved, cfg)
    from learner.distributed import wrap_for_ranks

    trainer = wrap_for_ranks(trainer)  # several ranks: each step's batch goes to the others first
    console(f"learner: {trainer.describe()}")
    tokenizer = await trio.to_thread.run_sync(load_tokenizer, resolved.hf_dir)
    task = run_task(cfg.task)
    episodes = episode_settings(cfg, task)  # None: single-turn run
    state = LoopState()
    if resume:
        state = await trio.to_thread.run_sync(load_state, run_dir, trainer)
        console(f"learner: resumed at step {state.step} (adapter v{state.version})")

    t = cfg.train
    buffer = None
    if cfg.sync.mode == "async":
        buffer = ReplayBuffer(cfg.sync.max_staleness, cfg.sync.buffer_limit(t.prompts_per_step))
    coord = Coordinator(
        Limits(group_size=t.group_size, max_tokens=t.max_tokens, vocab_size=len(tokenizer),
               **(episodes.limits() if episodes else {})),
        lease_timeout_s=cfg.sync.lease_timeout_s,
        groups_per_lease=cfg.sync.groups_per_lease,
        buffer=buffer,
    )
    coord.set_version(state.version)
    if resume:  # the problems that were in flight at the checkpoint go out again first
        coord.add_groups(reissue_specs(load_open_problems(run_dir), task, tokenizer, cfg.task.multi_turn))
    if episodes is not None:
        coord.verify = make_verifier(task, tokenizer)
    service = LearnerService(
        coordinator=coord,
        sampling=SamplingDefaults(t.temperature, t.top_p, t.max_tokens, t.seed),
        group_size=t.group_size,
        run_id=run_identity(run_dir, resume, uuid.uuid4().hex[:8])[1],
        model_name=cfg.model.name,
        long_poll_s=cfg.sync.long_poll_s,
        episode=episodes,
    )
    from learner.admission import build_admission  # who may join, per-peer caps (learner/admission.py)

    service.admission = build_admission(cfg.network, run_dir / "identity")
    service.pipeline_settings = pipeline_settings(cfg.pipeline)
    if cfg.verify.enabled:  # re-score sampled rollouts under their version (learner/verify.py)
        from learner.verify import Verifier

        service.verifier = Verifier(trainer, cfg.verify, t.temperature, t.top_p, state.version, seed=t.seed)
        trainer.train_step = service.verifier.exclusive(trainer.train_step)
    metrics = MetricsWriter(run_dir, resume=resume, resume_step=state.step)
    host_cfg = HostConfig(max_frame_bytes=cfg.network.max_frame_bytes, request_timeout_s=cfg.network.request_timeout_s)
    service.run_name = name
    identity_dir = Path(data_dir) if data_dir is not None else run_dir / "identity"
    async with open_host(identity_dir, listen_addr=cfg.network.listen, config=host_cfg,
                         announce=cfg.network.announce) as host, open_discovery(host) as discovery:
        service.register(host)
        if on_service is not None:
            on_service(service)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(service.expiry_loop)
            nursery.start_soon(service.verify_loop)  # re-scores held pushes after their ack
            service.dissem = await start_learner_dissem(nursery, host, cfg.dissem, service)
            from learner.model_serve import start_model_serve  # the base model, by content hash
            from node_agents.model_cache import cache_root

            model_serve = await start_model_serve(host, resolved.gguf_path or resolved.hf_dir, cfg.model.name,
                                                  cache_root(cfg.model.cache_dir or None))
            service.model_sha256, service.model_serve = model_serve.content_sha256, model_serve
            console(f"learner: base model {cfg.model.name} sha256 {model_serve.content_sha256[:12]}")
            from learner.web.server import start_learner_dashboard  # read-only web view (learner/web/)

            await start_learner_dashboard(nursery, cfg, service, metrics, state, run_dir, console)
            service.publish(adapter_reply(trainer.export_adapter(state.version)))
            nursery.start_soon(join_swarm, host, discovery, cfg.network.bootstrap, console, identity_dir)
            nursery.start_soon(keep_peers, identity_dir, service)  # remembered for the next start
            await announce_run(host, discovery, name)
            console(f"learner: listening on {host.peer_id} {' '.join(host.addrs)}")
            console(f"learner: run {name}; join with `swarm-node join --bootstrap {host.addrs[0]}` "
                    "(any member's address works)")
            task_status.started(list(host.addrs))
            t_start = time.perf_counter() - state.wall_s
            ctx = StepContext(cfg, state, coord, service, trainer, task, tokenizer, console)
            step_fn = async_step if cfg.sync.mode == "async" else sequential_step
            while state.step < t.steps:
                row = await step_fn(ctx)
                if service.verifier is not None:
                    row.update(service.verifier.take_metrics())
                    row["time_verify_s"] = row.get("verify_s", 0.0)  # inside the wait (learner/step_timing.py)
                state.wall_s = time.perf_counter() - t_start
                row["wall_s"] = round(state.wall_s, 2)
                metrics.write(row)
                console(progress_line(row, t.steps, rolling_mean(metrics.rewards())[-1]))
                if t.checkpoint_every and state.step % t.checkpoint_every == 0 and state.step < t.steps:
                    await trio.to_thread.run_sync(save_state, run_dir, trainer, state, open_problem_refs(coord))
            service.finish()
            await trio.to_thread.run_sync(save_state, run_dir, trainer, state, open_problem_refs(coord))
            await trio.to_thread.run_sync(trainer.save_adapter, run_dir / "adapter")
            if metrics.rows:
                plot_rewards(metrics.rows, run_dir / "reward.png", title=f"{cfg.task.name}: reward per step")
            (run_dir / "ledger.json").write_text(json.dumps(coord.counts(), indent=1))
            (run_dir / "swarm.json").write_text(json.dumps(service.swarm_summary(), indent=1))
            (run_dir / "model_fetch.json").write_text(json.dumps(model_serve.summary(), indent=1))
            if service.dissem is not None:  # reachability, relays and who sent each node its chunks
                (run_dir / "dissem.json").write_text(json.dumps(service.dissem.summary(), indent=1))
            console(f"learner: done; adapter in {run_dir / 'adapter'}, metrics in {run_dir / 'metrics.jsonl'}")
            await service.wait_nodes_told(active_within_s=cfg.sync.long_poll_s + 30.0, timeout_s=SHUTDOWN_GRACE_S)
            nursery.cancel_scope.cancel()
    return metrics.rows
