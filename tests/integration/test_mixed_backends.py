"""A mixed swarm in one run: the learner plus one ``swarm-node`` process per backend
(llama.cpp, torch, MLX on its CPU build) over real libp2p on 127.0.0.1; every backend's
rollouts are trained on. Takes a few minutes on two cores (much longer when they are busy), hence ``slow``
(``make test-slow``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import trio

from learner.config import LearnerConfig
from learner.demo import node_command, stop_processes
from learner.loop import run_learner
from learner.metrics import read_metrics
from swarm.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BACKENDS = ("llamacpp", "torch", "mlx")


@pytest.mark.timeout(1500)
def test_one_node_per_backend_all_used_in_training(tmp_path: Path):
    cfg = load_config(LearnerConfig, None, [
        'network.listen="/ip4/127.0.0.1/tcp/0"',  # not the launch default 0.0.0.0:4001
        "train.steps=2", "train.prompts_per_step=3", "train.group_size=2", "train.max_tokens=8",
        "train.micro_batch=6", "train.checkpoint_every=0", "sync.long_poll_s=5.0",
        f"sync.min_waiting_nodes={len(BACKENDS)}",  # first step: one group for each node
    ])
    procs: list[subprocess.Popen] = []
    seen: dict = {}

    def on_service(svc) -> None:
        seen["svc"] = svc

    async def main():
        async with trio.open_nursery() as nursery:
            addrs = await nursery.start(lambda task_status: run_learner(
                cfg, tmp_path / "run", console=lambda s: None, on_service=on_service, task_status=task_status))
            for b in BACKENDS:
                log = open(tmp_path / f"{b}.log", "w")
                cmd = node_command(addrs[0], tmp_path / b, 1, b, "default", b) + ["-v"]
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))

    async def bounded():
        with trio.fail_after(1200):  # about 2-3 min on an idle 2-core machine
            await main()

    try:
        trio.run(bounded)
    finally:
        stop_processes(procs, 20)
    logs = "".join(f"--- {b}\n" + (tmp_path / f"{b}.log").read_text() for b in BACKENDS)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2], logs
    svc = seen["svc"]
    backends = svc.node_backends()
    assert sorted(backends.values()) == sorted(BACKENDS), backends
    used: dict[str, int] = {}
    for r in rows:
        for peer, n in r["nodes"].items():
            used[backends[peer]] = used.get(backends[peer], 0) + n
    assert set(used) == set(BACKENDS), (used, logs)
    assert sum(used.values()) == 2 * 3 * 2
    for hello in svc.roster.statistics().nodes:  # what the learner kept of each hello
        assert hello.announced_tokens_per_s > 0, (hello.backend, "the join probe must reach the hello")
        assert int(hello.extra["cores"]) >= 1 and hello.extra["hw_kind"] == "cpu"
        assert hello.memory_bytes > 0
    assert all(p.returncode == 0 for p in procs), logs
