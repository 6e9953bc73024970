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
import resource
import time
import uuid
from pathlib import Path
from typing import Callable

import trio

from common.model_cache import cache_root
from learner.adapter_versions import KEEP_ADAPTER_VERSIONS, AdapterVersions
from learner.admission import ReadAccess, build_admission
from learner.buffer import ReplayBuffer
from learner.checkpoint import (LoopState, load_open_problems, load_state, open_problem_refs, reissue_specs,
                                run_identity, save_state)
from learner.config import LearnerConfig
from learner.contrib import ContribDesk
from learner.coordinator import Coordinator, Limits
from learner.dissem import start_learner_dissem
from learner.episodes import EpisodeSettings, episode_settings, make_verifier, run_task
from learner.heldout import EvalPoint, HeldOutEval, build_heldout, eval_due
from learner.identity import announce_run, join_line, join_swarm, keep_peers, run_name
from learner.metrics import MetricsWriter, plot_rewards, progress_line, rolling_mean
from learner.model_serve import start_model_serve
from learner.models import llamacpp_form, load_tokenizer, resolve_model
from learner.ledger import WorkLedger
from learner.stage_requests import stage_alive
from learner.replay_llamacpp import build_replay, replay_gguf
from learner.roster import NodeRoster
from learner.report_to import build_sinks
from learner.run_log import run_log
from learner.service import LearnerService, SamplingDefaults, ServiceSettings
from learner.step_adapters import cut_step_adapters, save_step_adapter
from learner.steps import StepContext, async_step, sequential_step
from learner.trainer_build import build_trainer
from learner.verify import Verifier
from learner.watch import RunWatch
from learner.web.server import start_learner_dashboard
from swarm.config import dump_toml, to_dict
from swarm.discovery.dht import open_discovery
from swarm.host import HostConfig, open_host
from swarm.membership import TicketIssuer
from swarm.nat.service import NatService
from swarm.proto.adapter import AdapterReply

log = logging.getLogger("echo_swarm.learner")

#: After the last step, the longest wait for active nodes to hear "done" before the host closes.
SHUTDOWN_GRACE_S = 20.0
#: Longest wait (s) at the end of a run for the last version's broadcast to start (its encode).
PUBLISH_WAIT_S = 120.0


def build_coordinator(cfg: LearnerConfig, vocab_size: int, episodes: EpisodeSettings | None,
                      verify: Callable | None = None) -> Coordinator:
    """The run's coordinator from ``[train]`` and ``[sync]`` (async mode: with its replay buffer)."""
    t = cfg.train
    buffer = None
    if cfg.sync.mode == "async":
        buffer = ReplayBuffer(cfg.sync.max_staleness, cfg.sync.buffer_limit(t.prompts_per_step))
    return Coordinator(
        Limits(group_size=t.group_size, max_tokens=t.max_tokens, vocab_size=vocab_size,
               **(episodes.limits() if episodes else {})),
        lease_timeout_s=cfg.sync.lease_timeout_s,
        groups_per_lease=cfg.sync.groups_per_lease,
        buffer=buffer,
        verify=verify,
    )


def service_settings(cfg: LearnerConfig, run_id: str, run_name: str, model_sha256: str) -> ServiceSettings:
    """The service's settings from ``[train]``, ``[sync]``, ``[pipeline]`` and the model."""
    t = cfg.train
    return ServiceSettings(
        sampling=SamplingDefaults(t.temperature, t.top_p, t.max_tokens, t.seed),
        group_size=t.group_size, run_id=run_id, model_name=cfg.model.name, long_poll_s=cfg.sync.long_poll_s,
        run_name=run_name, model_sha256=model_sha256,
        gate=cfg.sync,
        pipeline=cfg.pipeline,
    )


async def evaluate_held_out(heldout: HeldOutEval, watch: RunWatch, trainer, state: LoopState,
                            console: Callable[[str], None]) -> tuple[dict, HeldOutEval | None]:
    """The held-out score of the adapter after ``state.step`` (``learner/heldout.py``) as the row's
    ``eval_*`` fields, and the evaluator to keep using: an evaluation that fails is logged and
    turned off for the rest of the run (None), and training goes on."""
    try:
        adapter = trainer.export_adapter(state.version)
        # a learner stopped meanwhile does not wait for the rest: the thread ends at its next problem
        result, samples = await trio.to_thread.run_sync(  # trio-typing's stubs predate abandon_on_cancel
            heldout.run, adapter, abandon_on_cancel=True)  # type: ignore[call-arg]
    except trio.Cancelled:
        heldout.stop()
        raise
    except Exception as e:  # the task's eval split, llama.cpp: not worth stopping the training for
        log.warning("held-out evaluation failed at step %d (%r); it is off for the rest of the run", state.step, e)
        heldout.close()
        return {}, None
    point = EvalPoint.of(state.step, state.version, result)
    console(f"learner: held-out eval at step {point.step} (v{point.version}): {point.correct}/{point.n} correct, "
            f"accuracy {point.accuracy:.3f} [95% CI {point.ci_low:.3f}-{point.ci_high:.3f}], "
            f"mean reward {point.mean_reward:.3f}, {point.seconds:.1f}s")
    return watch.evaluated(point, samples), heldout


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
    passes ``--data-dir``); None = ``run_dir/identity`` (one identity per run dir). Every
    console line and warning also goes to ``run_dir/learner.log`` (``learner/run_log.py``)."""
    with run_log(Path(run_dir), console) as logged:
        return await _run_learner(cfg, Path(run_dir), resume, logged.console, on_service, data_dir, task_status)


async def _run_learner(cfg: LearnerConfig, run_dir: Path, resume: bool, console: Callable[[str], None],
                       on_service: Callable[[LearnerService], None] | None, data_dir: Path | None,
                       task_status) -> list[dict]:
    name = run_name(cfg)
    (run_dir / "config.toml").write_text(dump_toml(to_dict(cfg)))
    console(f"learner: loading model {cfg.model.name!r} ...")
    t_load = time.perf_counter()
    resolved = await trio.to_thread.run_sync(resolve_model, cfg.model.name, cfg.model.cache_dir or None,
                                             cfg.model.revision)
    # what llama.cpp nodes load, served beside an HF directory (converted once, cached)
    gguf = await trio.to_thread.run_sync(
        lambda: llamacpp_form(resolved, cfg.model.gguf_outtype, cfg.model.cache_dir or None, console))
    trainer = await trio.to_thread.run_sync(build_trainer, resolved, cfg)
    console(f"learner: {trainer.describe()}; loaded in {time.perf_counter() - t_load:.0f} s, peak resident "
            f"memory so far {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
    tokenizer = await trio.to_thread.run_sync(load_tokenizer, resolved.hf_dir)
    task = run_task(cfg.task)
    episodes = episode_settings(cfg, task)  # None: single-turn run
    state = LoopState()
    if resume:
        state = await trio.to_thread.run_sync(load_state, run_dir, trainer)
        console(f"learner: resumed at step {state.step} (adapter v{state.version})")
    t = cfg.train
    coord = build_coordinator(cfg, len(tokenizer), episodes,
                              verify=make_verifier(task, tokenizer) if episodes is not None else None)
    coord.set_version(state.version)
    if resume:  # the problems that were in flight at the checkpoint go out again first
        coord.add_groups(reissue_specs(load_open_problems(run_dir), task, tokenizer, cfg.task.multi_turn))
    verifier = None
    if cfg.verify.enabled:  # re-score sampled rollouts under their version (learner/verify.py)
        in_step = cfg.verify.in_step and cfg.sync.mode == "sequential" and not trainer.ranks.active
        precision = "bf16" if trainer.bf16_autocast or trainer.base_dtype == "bfloat16" else "fp32"
        verifier = Verifier(trainer, cfg.verify, t.temperature, t.top_p, state.version, seed=t.seed, in_step=in_step,
                            sampling_seed=t.seed, train_precision=precision)
    run_id = run_identity(run_dir, resume, uuid.uuid4().hex[:8])[1]
    metrics = MetricsWriter(run_dir, resume=resume, resume_step=state.step,
                            sinks=build_sinks(cfg.report, run_dir, config=to_dict(cfg), run_id=run_id,
                                              resume_step=state.step if resume else None))
    # sampled completions and the held-out curve (learner/watch.py); adapters per N steps
    watch = RunWatch(run_dir, metrics, resume_step=state.step if resume else None, eval_samples=cfg.eval.samples)
    if resume:
        cut_step_adapters(run_dir, state.step)
    heldout = build_heldout(cfg, resolved.gguf_path, resolved.hf_dir, task, tokenizer)
    host_cfg = HostConfig(max_frame_bytes=cfg.network.max_frame_bytes, request_timeout_s=cfg.network.request_timeout_s,
                          limits=cfg.limits)
    identity_dir = Path(data_dir) if data_dir is not None else run_dir / "identity"
    async with open_host(identity_dir, listen_addr=cfg.network.listen, config=host_cfg,
                         announce=cfg.network.announce) as host, open_discovery(host) as discovery:
        roster = NodeRoster()  # the nodes that said hello
        admission = build_admission(cfg.network, run_dir / "identity")
        access = ReadAccess(admission, roster.is_member,  # who may read a private run's content
                            issuer=TicketIssuer(host.private_key(), host.peer_id, run_id))  # members' tickets
        model_serve = await start_model_serve(host, resolved.gguf_path or resolved.hf_dir, cfg.model.name,
                                              cache_root(cfg.model.cache_dir or None), access=access, gguf=gguf)
        console(f"learner: base model {cfg.model.name} sha256 {model_serve.content_sha256[:12]}")
        # every version a group may still be trained from is kept: its groups are checked under it
        versions = AdapterVersions(keep=max(KEEP_ADAPTER_VERSIONS, cfg.sync.max_staleness + 2))
        ledger = WorkLedger()
        if verifier is not None:  # async groups of an older version: scored under its published adapter
            verifier.adapter_of = lambda v: versions.get(v).to_adapter().tensors if v in versions else None
            verifier.held_error = versions.held_error  # a lossy codec: checked under what nodes decoded
        # the GGUF llama.cpp nodes load, replayed exactly (learner/replay.py): the served one, or for an
        # HF directory whose nodes quantise it (replay.gguf_quant), the same quantised form
        replay_model = gguf if resolved.gguf_path is not None or cfg.replay.gguf_quant == "keep" else \
            await trio.to_thread.run_sync(replay_gguf, cfg, resolved.hf_dir, model_serve.content_sha256,
                                          cfg.model.cache_dir or None, console)
        replay = build_replay(cfg, replay_model, versions, roster.numerics_of)
        if replay is not None:
            await trio.to_thread.run_sync(replay.open)
        async with trio.open_nursery() as nursery:
            nat = NatService(host, cfg.nat)  # relay for NAT'd nodes, hole punching (swarm/nat)
            await nursery.start(nat.run)
            dissem = await start_learner_dissem(nursery, host, cfg.dissem, run_id, versions,
                                                admit=roster.is_member, reads=access.refusal)
            service = LearnerService(
                coord, service_settings(cfg, run_id, name, model_serve.content_sha256),
                versions=versions, roster=roster, admission=admission,
                verifier=verifier, episode=episodes, dissem=dissem, model_serve=model_serve, console=console,
                probe=lambda peer: stage_alive(host, peer), ledger=ledger, replay=replay,
                validators=cfg.validators)
            service.register(host)
            # each node's own credit, asked by `swarm-node status` (swarm/proto/contrib.py)
            ContribDesk(ledger, lambda p: roster.name_of(p) if p in roster else None, run_id, name).register(host)
            if on_service is not None:
                on_service(service)
            nursery.start_soon(service.expiry_loop)
            nursery.start_soon(service.verify_loop)  # re-scores held pushes after their ack
            await start_learner_dashboard(nursery, cfg, service, metrics, state, run_dir, console, watch=watch)
            service.publish(AdapterReply.from_adapter(trainer.export_adapter(state.version)))
            nursery.start_soon(join_swarm, host, discovery, cfg.network.bootstrap, console, identity_dir)
            nursery.start_soon(keep_peers, identity_dir, roster)  # remembered for the next start
            await announce_run(host, discovery, name)
            console(f"learner: listening on {host.peer_id} {' '.join(host.addrs)}")
            console(join_line(name, host.peer_id, host.addrs[0]))
            task_status.started(list(host.addrs))
            if heldout is not None and cfg.eval.on_start and state.step == 0:  # while the nodes start
                _, heldout = await evaluate_held_out(heldout, watch, trainer, state, console)
            t_start = time.perf_counter() - state.wall_s
            train = verifier.exclusive(trainer.train_step) if verifier is not None else trainer.train_step
            ctx = StepContext(cfg, state, coord, service, trainer, task, tokenizer, console, train)
            step_fn = async_step if cfg.sync.mode == "async" else sequential_step
            while state.step < t.steps:
                row = await step_fn(ctx)
                shown = row.pop("completions", [])
                if verifier is not None:
                    row.update(verifier.take_metrics())
                    if service.checks is not None:
                        row.update(service.checks.new_step())
                    # the checks' share inside the wait (learner/step_timing.py); in-step ones are in fwd_bwd
                    row["time_verify_s"] = round(row.get("verify_s", 0.0) - row.get("verify_in_step_s", 0.0), 3)
                if replay is not None:
                    row.update(replay.take_metrics())
                if service.validators is not None:
                    row.update(service.validators.take_metrics())
                ledger.trained(row.pop("trained_groups", {}), row.pop("trained_ids", {}))
                if heldout is not None and eval_due(cfg.eval.every, state.step, t.steps):
                    fields, heldout = await evaluate_held_out(heldout, watch, trainer, state, console)
                    row.update(fields)
                state.wall_s = time.perf_counter() - t_start
                row["wall_s"] = round(state.wall_s, 2)
                metrics.write(row)
                watch.completions(state.step, shown)
                console(progress_line(row, t.steps, rolling_mean(metrics.rewards())[-1]))
                if t.adapter_every and state.step % t.adapter_every == 0:
                    await trio.to_thread.run_sync(save_step_adapter, run_dir, trainer, state.step)
                if t.checkpoint_every and state.step % t.checkpoint_every == 0 and state.step < t.steps:
                    await trio.to_thread.run_sync(save_state, run_dir, trainer, state, open_problem_refs(coord))
            service.finish()
            if heldout is not None:
                heldout.close()
            if replay is not None:  # waits for a replay in progress (the context's lock)
                await trio.to_thread.run_sync(replay.close)
            await trio.to_thread.run_sync(save_state, run_dir, trainer, state, open_problem_refs(coord))
            await trio.to_thread.run_sync(trainer.save_adapter, run_dir / "adapter")
            metrics.close()  # TensorBoard / W&B
            if metrics.rows:
                plot_rewards(metrics.rows, run_dir / "reward.png", title=f"{cfg.task.name}: reward per step")
            (run_dir / "ledger.json").write_text(json.dumps(coord.counts(), indent=1))
            (run_dir / "swarm.json").write_text(json.dumps(service.swarm_summary(), indent=1))
            (run_dir / "model_fetch.json").write_text(json.dumps(model_serve.summary(), indent=1))
            # reachability, relays and who sent each node its chunks; the last version's broadcast
            # is queued by its step and encoded in a worker thread: it is in the summary once started
            if not await dissem.wait_published(state.version, PUBLISH_WAIT_S):
                console(f"learner: v{state.version} was not encoded within {PUBLISH_WAIT_S:.0f} s; dissem.json lacks it")
            (run_dir / "dissem.json").write_text(json.dumps(dissem.summary(), indent=1))
            console(f"learner: done; adapter in {run_dir / 'adapter'}, metrics in {run_dir / 'metrics.jsonl'}")
            await service.wait_nodes_told(active_within_s=cfg.sync.long_poll_s + 30.0, timeout_s=SHUTDOWN_GRACE_S)
            nursery.cancel_scope.cancel()
    return metrics.rows
