"""Every section of the learner's config reaches the part that uses it, through the real wiring
of ``swarm-learner launch`` (:func:`learner.loop.run_learner`, stopped once it serves): each section
gets values other than its defaults, and each is read back from the live part that uses it
(the trainer, the coordinator, the service and the parts it owns, admission, verification,
dissemination, the dashboard, the task).
"""

from __future__ import annotations

import dataclasses
import socket
from pathlib import Path

import httpx
import pytest
import trio

import learner.loop as loop
from learner.config import LearnerConfig
from swarm.config import load_config

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_config_section_reaches_its_component(tmp_path: Path, monkeypatch):
    port = _free_port()
    cfg = load_config(LearnerConfig, None, [
        'network.listen="/ip4/127.0.0.1/tcp/0"', "network.max_leases_per_peer=3", "network.max_pushes_per_min=77",
        'task.name="arith"', "task.seed=7", "task.options={max_value = 30}",
        "lora.rank=4", "lora.alpha=8.0", 'lora.target_modules=["q_proj", "v_proj"]',
        "train.steps=1", "train.group_size=3", "train.max_tokens=24", "train.temperature=0.9", "train.top_p=0.95",
        "train.seed=5", "train.lr=1e-4", "train.micro_batch=6", "train.checkpoint_every=0",
        'sync.mode="async"', "sync.max_staleness=2", "sync.buffer_groups=50", "sync.lease_timeout_s=77.0",
        "sync.groups_per_lease=2", "sync.long_poll_s=2.5", "sync.min_waiting_nodes=3",
        "sync.regate_each_version=true", "sync.gate_timeout_s=12.0",
        "dissem.fan_out=3", "dissem.chunk_bytes=131072", "dissem.stall_timeout_s=2.0",
        "dashboard.enabled=true", f'dashboard.listen="127.0.0.1:{port}"', "dashboard.min_update_s=0.5",
        "verify.sample_frac=0.5", "verify.first_groups=3", "verify.max_abs_z=5.0", "verify.newcomer_s_per_step=7.5",
        'verify.draw_tolerance={"llamacpp@bf16" = [0.05, 3]}',
        'run.name="wiring-test"',
        "pipeline.prompt_tokens=128", "pipeline.in_flight=3", "pipeline.stale_s=100.0",
        "pipeline.usable_fraction=0.8", "pipeline.hop_s=0.01", "pipeline.min_gain=0.3", "pipeline.cooldown_s=7.0",
        "limits.requests_per_min_peer=999.0", "limits.streams_per_block=77",
        "nat.relay_max_circuits=3", "nat.relay_circuit_bytes=12345",
        "replay.budget_s_per_step=12.5", "replay.contexts=3", "replay.max_threads=9", "replay.burst_steps=3",
        "validators.deadline_s=77.0", "validators.max_logprob_diff=0.01", "validators.max_jobs_per_peer=2",
        'report.to=["tensorboard"]',
        "eval.every=1", "eval.n=5", "eval.on_start=false", "eval.max_tokens=16", "eval.samples=2",
    ])
    default = LearnerConfig()
    tasks_made = []
    real_run_task = loop.run_task
    monkeypatch.setattr(loop, "run_task", lambda task_cfg: tasks_made.append(task_cfg) or real_run_task(task_cfg))
    seen: dict = {}
    lines: list[str] = []
    real_nat = loop.NatService
    monkeypatch.setattr(loop, "NatService", lambda host, nat_cfg: seen.setdefault("nat", real_nat(host, nat_cfg)))
    real_heldout = loop.build_heldout
    monkeypatch.setattr(loop, "build_heldout", lambda *a: seen.setdefault("heldout", real_heldout(*a)))

    def on_service(service) -> None:
        seen["service"] = service

    async def main() -> None:
        with trio.fail_after(300):
            await serve_then_stop()

    async def serve_then_stop() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: loop.run_learner(
                cfg, tmp_path / "run", console=lines.append, on_service=on_service, task_status=task_status))
            async with httpx.AsyncClient() as client:  # the dashboard, on the configured address
                seen["dashboard"] = (await client.get(f"http://127.0.0.1:{port}/api/snapshot", timeout=10)).status_code
            nursery.cancel_scope.cancel()  # no node joins: the step would wait for ever

    trio.run(main)
    svc = seen["service"]
    checked = set()

    checked.add("model")
    assert svc.settings.model_name == cfg.model.name and svc.model_serve.summary()["name"]

    checked.add("task")
    assert tasks_made == [cfg.task] and cfg.task.seed != default.task.seed

    checked.add("lora")
    trainer = svc.verifier.trainer
    assert (trainer.lora.rank, trainer.lora.alpha, list(trainer.lora.target_modules)) == (4, 8.0, ["q_proj", "v_proj"])
    v0 = svc.versions.get(0)
    assert v0.rank == 4 and v0.alpha == 8.0 and sorted(v0.target_modules) == ["q_proj", "v_proj"]

    checked.add("train")
    assert trainer.train.lr == 1e-4 and trainer.train.micro_batch == 6 and trainer.train.seed == 5
    assert (svc.settings.group_size, svc.coordinator.limits.group_size, svc.coordinator.limits.max_tokens) == (3, 3, 24)
    s = svc.settings.sampling
    assert (s.temperature, s.top_p, s.max_tokens, s.seed) == (0.9, 0.95, 24, 5)
    assert (svc.verifier.temperature, svc.verifier.top_p) == (0.9, 0.95)

    checked.add("sync")
    c = svc.coordinator
    assert (c.lease_timeout_s, c.groups_per_lease) == (77.0, 2)
    assert (c.buffer.max_staleness, c.buffer.capacity) == (2, 50)
    assert svc.desk.long_poll_s == 2.5
    gate = svc.desk.gate.settings
    assert (gate.min_waiting_nodes, gate.regate_each_version, gate.gate_timeout_s) == (3, True, 12.0)

    checked.add("network")
    p = svc.admission.policy
    assert (p.max_leases_per_peer, p.max_pushes_per_min) == (3, 77)
    assert any("/ip4/127.0.0.1/tcp/" in line for line in lines if "listening on" in line)

    checked.add("dissem")
    d = svc.dissem.cfg
    assert (d.fan_out, d.chunk_bytes, d.stall_timeout_s) == (3, 131072, 2.0)

    checked.add("dashboard")
    assert seen["dashboard"] == 200

    checked.add("verify")
    v = svc.verifier.cfg
    assert (v.sample_frac, v.first_groups, v.max_abs_z) == (0.5, 3, 5.0)
    assert svc.checks.newcomers.budget_s_per_step == 7.5  # the verify queue's budget for new peers' checks
    tol = svc.verifier.tolerance("llamacpp", "bf16")  # the draw check's (learner/draw_check.py)
    assert (tol.eps, tol.allowed) == (0.05, 2)  # never wider than the widest class: allowed capped

    checked.add("run")
    assert svc.settings.run_name == "wiring-test"

    checked.add("pipeline")
    ps = svc.pipelines.settings
    assert (ps.prompt_tokens, ps.in_flight, ps.stale_s) == (128, 3, 100.0)
    assert (ps.usable_fraction, ps.hop_s, ps.min_gain, ps.cooldown_s) == (0.8, 0.01, 0.3, 7.0)
    assert svc.pipelines.run.in_flight == 3 and svc.pipelines.run.max_tokens == 24 + 128

    checked.add("limits")
    lim = svc.dissem.host.gate.limits.settings
    assert (lim.requests_per_min_peer, lim.streams_per_block) == (999.0, 77)

    checked.add("nat")
    relay = seen["nat"]._relay  # the live circuit relay v2 service the learner runs
    assert relay.allow_hop and (relay.limits.max_circuit_conns, relay.limits.data) == (3, 12345)

    checked.add("replay")
    rp = svc.checks.replay  # the learner's llama.cpp replayer, in the verify queue (learner/replay.py)
    assert (rp.cfg.contexts, rp.cfg.max_threads, rp.budget.budget_s_per_step, rp.budget.keep_steps) == (3, 9, 12.5, 3)

    checked.add("validators")
    vd = svc.validators  # validator nodes' desk (learner/validator_desk.py), used by the verify queue
    assert svc.checks.validators is vd
    assert (vd.cfg.deadline_s, vd.cfg.max_logprob_diff, vd.cfg.max_jobs_per_peer) == (77.0, 0.01, 2)

    checked.add("report")  # TensorBoard's event file is opened in the run dir when the metrics writer starts
    assert list((tmp_path / "run").glob("events.out.tfevents.*"))
    assert (tmp_path / "run" / "completions.jsonl").exists()  # the completions table's file (learner/watch.py)

    checked.add("eval")  # the learner's held-out evaluator (learner/heldout.py); on_start off: nothing ran
    heldout = seen["heldout"]
    assert (heldout.cfg.every, heldout.cfg.n, heldout.max_tokens, heldout.seed) == (1, 5, 16, 5)
    assert not (tmp_path / "run" / "eval.jsonl").read_text()

    # every section of the config is checked above, and every checked value differs from its default
    assert checked == {f.name for f in dataclasses.fields(LearnerConfig)}
    assert cfg.pipeline != default.pipeline and cfg.sync != default.sync and cfg.verify != default.verify
