"""The whole slice over real libp2p on 127.0.0.1: an in-process learner and separate
``swarm-node`` OS processes running llama.cpp."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
import trio

from learner.config import LearnerConfig
from learner.demo import node_command, stop_processes
from learner.loop import run_learner
from learner.metrics import read_metrics
from swarm.config import load_config, with_values

pytestmark = pytest.mark.integration


def small_config(**sync) -> LearnerConfig:
    overrides = [
        "train.steps=2", "train.prompts_per_step=2", "train.group_size=2", "train.max_tokens=12",
        "train.micro_batch=4", "train.checkpoint_every=0", "sync.long_poll_s=1.0",
        'network.listen="/ip4/127.0.0.1/tcp/0"',  # not the launch default 0.0.0.0:4001
    ] + [f"sync.{k}={v}" for k, v in sync.items()]
    return load_config(LearnerConfig, None, overrides)


def spawn_node(addr: str, tmp: Path, name: str) -> subprocess.Popen:
    log = open(tmp / f"{name}.log", "w")
    cmd = node_command(addr, tmp / name, 1, name, "default") + ["--no-probe", "-v"]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


async def with_deadline(fn, seconds):
    with trio.fail_after(seconds):
        await fn()


def test_two_nodes_two_steps_versions_advance_across_a_resume(tmp_path):
    """Step 1, stop, then ``--resume`` to step 2 with fresh node processes: the rollouts of step
    k carry adapter version k-1, and the resumed run continues the version and the metrics."""
    procs: list[subprocess.Popen] = []

    def phase(steps: int, resume: bool, tag: str) -> None:
        async def main():
            cfg = with_values(small_config(), {"train.steps": steps})
            async with trio.open_nursery() as nursery:
                addrs = await nursery.start(lambda task_status: run_learner(
                    cfg, tmp_path / "run", resume=resume, console=lambda s: None, task_status=task_status))
                for i in range(2):
                    procs.append(spawn_node(addrs[0], tmp_path, f"node-{tag}{i}"))

        try:
            trio.run(with_deadline, main, 300)
        finally:
            stop_processes(procs, 20)

    phase(1, False, "a")
    assert (tmp_path / "run" / "checkpoints" / "latest").exists()
    phase(2, True, "b")
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    # Step k trains on rollouts generated with exactly adapter version k-1 (sequential mode).
    assert [r["rollout_versions"] for r in rows] == [[0], [1]]
    assert [r["policy_version"] for r in rows] == [1, 2]
    # the trainer's update count came back from the checkpoint and went on
    assert rows[1]["train_step"] == 2 * rows[0]["train_step"] > 0
    assert all(r["samples"] == 4 for r in rows)
    assert sum(sum(r["nodes"].values()) for r in rows) == 8
    logs = {tag: "".join((tmp_path / f"node-{tag}{i}.log").read_text() for i in range(2)) for tag in "ab"}
    assert "v0 lease" in logs["a"] and "v1 lease" in logs["b"] and "v0 lease" not in logs["b"], logs
    assert all(p.returncode == 0 for p in procs), logs
    assert (tmp_path / "run" / "adapter" / "adapter_config.json").exists()
    assert (tmp_path / "run" / "reward.png").exists()


def test_killed_node_lease_expires_and_is_reissued(tmp_path):
    procs: list[subprocess.Popen] = []
    seen: dict = {}

    async def main():
        async with trio.open_nursery() as nursery:
            addrs = await nursery.start(lambda task_status: run_learner(
                small_config(lease_timeout_s=6.0, groups_per_lease=2), tmp_path / "run",
                console=lambda s: None, on_service=lambda s: seen.setdefault("svc", s), task_status=task_status))
            coord = seen["svc"].coordinator
            victim = spawn_node(addrs[0], tmp_path, "victim")
            procs.append(victim)
            with trio.fail_after(120):
                while not coord.ledger.leases:  # the victim holds a lease
                    await trio.sleep(0.05)
            victim_peer = next(iter(coord.ledger.leases.values())).peer_id
            victim.send_signal(signal.SIGKILL)
            seen["victim"] = victim_peer
            procs.append(spawn_node(addrs[0], tmp_path, "survivor"))

    try:
        trio.run(with_deadline, main, 300)
    finally:
        stop_processes(procs, 20)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["samples"] == 4 for r in rows)
    # Everything trained came from the survivor; the victim's groups were re-issued.
    assert all(seen["victim"] not in r["nodes"] for r in rows)
    ledger = seen["svc"].coordinator.counts()
    assert ledger == {"trained": 4}
    assert procs[1].returncode == 0


def test_async_mode_two_nodes_overlap_within_staleness_bound(tmp_path):
    """Async push-pull with S=1: nodes keep generating while the learner trains, so later
    batches hold rollouts one version old, and never older; every group is accounted for."""
    procs: list[subprocess.Popen] = []
    seen: dict = {}

    async def main():
        async with trio.open_nursery() as nursery:
            cfg = with_values(small_config(mode="async", max_staleness=1), {"train.steps": 3})
            addrs = await nursery.start(lambda task_status: run_learner(
                cfg, tmp_path / "run", console=lambda s: None, on_service=lambda s: seen.setdefault("svc", s),
                task_status=task_status))
            for i in range(2):
                procs.append(spawn_node(addrs[0], tmp_path, f"node-{i}"))

    try:
        trio.run(with_deadline, main, 300)
    finally:
        stop_processes(procs, 20)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["samples"] == 4 and set(r["staleness_hist"]) <= {"0", "1"}
        assert all(r["trained_on_version"] - 1 <= v <= r["trained_on_version"] for v in r["rollout_versions"])
        assert r["learner_idle_s"] >= 0 and r["samples_per_s"] > 0
    assert any(r["staleness_max"] == 1 for r in rows), [r["staleness_hist"] for r in rows]
    ledger = seen["svc"].coordinator.counts()
    assert ledger["trained"] == 6 and sum(ledger.values()) == len(seen["svc"].coordinator.ledger)
    assert set(ledger) <= {"trained", "pending", "leased", "held", "completed", "dropped:stale", "dropped:evicted"}
    logs = "".join((tmp_path / f"node-{i}.log").read_text() for i in range(2))
    assert all(p.returncode == 0 for p in procs), logs
    swarm = __import__("json").loads((tmp_path / "run" / "swarm.json").read_text())
    assert sum(n["completions"] for n in swarm["nodes"].values()) >= 12
