"""Sequential learner loop (Echo's sequential pull).

Per step: publish version v -> lease this step's prompt groups to nodes for v -> wait for
the whole batch -> recompute rewards with ``tasks/`` (a node's reward is never trusted)
-> group-relative advantages -> GRPO step -> v + 1. Leases of dead nodes expire and are
re-issued by the service; every group ends up trained exactly once.
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

from learner.config import LearnerConfig
from learner.coordinator import COMPLETED, CompletedGroup, Coordinator, GroupSpec, Limits
from learner.metrics import MetricsWriter, plot_rewards, progress_line, rolling_mean
from learner.publish import adapter_reply
from learner.service import LearnerService, SamplingDefaults
from swarm.config import dump_toml, to_dict

log = logging.getLogger("echo_swarm.learner")

#: Print a "waiting for rollouts" line when a batch has made no progress for this long.
WAIT_REPORT_S = 30.0
#: After the last step, the longest wait for active nodes to hear "done" before the host closes.
SHUTDOWN_GRACE_S = 20.0


@dataclass
class LoopState:
    """What a checkpoint needs besides the trainer's own state."""

    step: int = 0
    version: int = 0
    next_problem: int = 0
    wall_s: float = 0.0


def build_trainer(resolved, cfg: LearnerConfig):
    """The peft/GRPO trainer from the learner config (heavy: loads the model)."""
    from learner.trainer import ComputeConfig, LoraConfig, LossConfig, OptimConfig, Trainer

    t, lo = cfg.train, cfg.lora
    return Trainer(
        resolved,
        lora=LoraConfig(rank=lo.rank, alpha=lo.alpha, target_modules=tuple(lo.target_modules)),
        optim=OptimConfig(lr=t.lr, weight_decay=t.weight_decay, max_grad_norm=t.max_grad_norm),
        loss=LossConfig(kind=t.loss, clip_eps_low=t.clip_low, clip_eps_high=t.clip_high, is_cap=t.is_cap),
        compute=ComputeConfig(micro_batch_size=t.micro_batch, temperature=t.temperature,
                              torch_threads=t.torch_threads or None),
        seed=t.seed,
    )


def score_groups(groups: list[CompletedGroup], task, tokenizer) -> tuple[list, list[float]]:
    """Rewards recomputed from the tokens -> per-completion samples with GRPO advantages."""
    from learner.grpo import group_advantages
    from learner.trainer import TrainSample

    samples: list = []
    all_rewards: list[float] = []
    for g in groups:
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
    task_status=trio.TASK_STATUS_IGNORED,
) -> list[dict]:
    """Run the whole training job; ``task_status.started(addrs)`` once nodes can join.
    ``on_service`` receives the live service (tests and tools watch its coordinator)."""
    from learner.checkpoint import load_state, save_state
    from learner.models import resolve_model
    from swarm.host import HostConfig, open_host
    from tasks.registry import make_task

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(dump_toml(to_dict(cfg)))
    console(f"learner: loading model {cfg.model.name!r} ...")
    resolved = await trio.to_thread.run_sync(resolve_model, cfg.model.name, cfg.model.cache_dir or None)
    trainer = await trio.to_thread.run_sync(build_trainer, resolved, cfg)
    tokenizer = await trio.to_thread.run_sync(load_tokenizer, resolved.hf_dir)
    task = make_task(cfg.task)
    state = LoopState()
    if resume:
        state = await trio.to_thread.run_sync(load_state, run_dir, trainer)
        console(f"learner: resumed at step {state.step} (adapter v{state.version})")

    t = cfg.train
    coord = Coordinator(
        Limits(group_size=t.group_size, max_tokens=t.max_tokens, vocab_size=len(tokenizer)),
        lease_timeout_s=cfg.sync.lease_timeout_s,
        groups_per_lease=cfg.sync.groups_per_lease,
    )
    service = LearnerService(
        coordinator=coord,
        sampling=SamplingDefaults(t.temperature, t.top_p, t.max_tokens, t.seed),
        group_size=t.group_size,
        run_id=uuid.uuid4().hex[:8],
        model_name=cfg.model.name,
        long_poll_s=cfg.sync.long_poll_s,
    )
    metrics = MetricsWriter(run_dir, resume=resume)
    host_cfg = HostConfig(max_frame_bytes=cfg.network.max_frame_bytes, request_timeout_s=cfg.network.request_timeout_s)
    async with open_host(run_dir / "identity", listen_addr=cfg.network.listen, config=host_cfg) as host:
        service.register(host)
        if on_service is not None:
            on_service(service)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(service.expiry_loop)
            service.publish(adapter_reply(trainer.export_adapter(state.version)))
            console(f"learner: listening on {host.addrs[0]}")
            console(f"learner: join with `swarm-node join --learner {host.addrs[0]}`")
            task_status.started(list(host.addrs))
            t_start = time.perf_counter() - state.wall_s
            while state.step < t.steps:
                row = await _one_step(cfg, state, coord, service, trainer, task, tokenizer, console)
                state.wall_s = time.perf_counter() - t_start
                row["wall_s"] = round(state.wall_s, 2)
                metrics.write(row)
                console(progress_line(row, t.steps, rolling_mean(metrics.rewards())[-1]))
                if t.checkpoint_every and state.step % t.checkpoint_every == 0 and state.step < t.steps:
                    await trio.to_thread.run_sync(save_state, run_dir, trainer, state)
            service.finish()
            await trio.to_thread.run_sync(save_state, run_dir, trainer, state)
            await trio.to_thread.run_sync(trainer.save_adapter, run_dir / "adapter")
            if metrics.rows:
                plot_rewards(metrics.rows, run_dir / "reward.png", title=f"{cfg.task.name}: reward per step")
            (run_dir / "ledger.json").write_text(json.dumps(coord.counts(), indent=1))
            console(f"learner: done; adapter in {run_dir / 'adapter'}, metrics in {run_dir / 'metrics.jsonl'}")
            await service.wait_nodes_told(active_within_s=cfg.sync.long_poll_s + 30.0, timeout_s=SHUTDOWN_GRACE_S)
            nursery.cancel_scope.cancel()
    return metrics.rows


async def _one_step(cfg, state: LoopState, coord: Coordinator, service: LearnerService, trainer, task, tokenizer, console) -> dict:
    t = cfg.train
    t0 = time.perf_counter()
    specs = []
    for idx in range(state.next_problem, state.next_problem + t.prompts_per_step):
        problem = task.problem("train", idx)
        specs.append(GroupSpec(f"g{idx}", task.render_prompt(tokenizer, problem), str(idx)))
    state.next_problem += t.prompts_per_step
    coord.add_groups(specs)
    service.take_contributions()
    service.notify()
    ids = [s.group_id for s in specs]
    while not all(coord.ledger[g] == COMPLETED for g in ids):
        with trio.move_on_after(WAIT_REPORT_S) as scope:
            await service.wait_changed()
        if scope.cancelled_caught:
            done = sum(coord.ledger[g] == COMPLETED for g in ids)
            console(f"learner: step {state.step + 1} waiting for rollouts ({done}/{len(ids)} groups, "
                    f"{len(service.nodes)} node(s) joined)")
    gen_wait = time.perf_counter() - t0
    groups = coord.take(ids)
    samples, rewards = score_groups(groups, task, tokenizer)
    t1 = time.perf_counter()
    stats = await trio.to_thread.run_sync(trainer.train_step, samples)
    train_s = time.perf_counter() - t1
    state.step += 1
    state.version += 1
    service.publish(adapter_reply(trainer.export_adapter(state.version)))
    comps = [c for g in groups for c in g.result.completions]
    return {
        **{f"train_{k}" if k in ("step", "step_time_s", "tokens", "sequences") else k: v
           for k, v in stats.items() if isinstance(v, (int, float))},
        "step": state.step,
        "policy_version": state.version,
        "trained_on_version": state.version - 1,
        "reward_mean": sum(rewards) / len(rewards),
        "samples": len(rewards),
        "step_time_s": round(time.perf_counter() - t0, 3),
        "gen_wait_s": round(gen_wait, 3),
        "train_s": round(train_s, 3),
        "nodes": service.take_contributions(),
        "rollout_versions": sorted({g.result.version for g in groups}),
        "mean_completion_tokens": sum(len(c.token_ids) for c in comps) / len(comps),
        "stop_frac": sum(c.finish_reason == "stop" for c in comps) / len(comps),
    }
