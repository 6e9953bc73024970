"""Discovery with real ``swarm-node`` processes on 127.0.0.1: node 1 joins through the
learner's address as a bootstrap, node 2 knows only a dead address and node 1's, learns the
run from node 1 and finds the learner through the DHT; a node asking for another run exits
with the learner's reason; the learner is then restarted with the same data dir and port,
keeps its peer id, and both still-running nodes find it again and finish the run. (The run's
identity, NAME@PEERID, and an impostor claiming the run: ``test_impostor_processes.py``.)"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from learner.config import LearnerConfig
from learner.demo import stop_processes
from learner.loop import run_learner
from learner.metrics import read_metrics
from swarm.addrs import split_peer_id
from swarm.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUN = "disc-test"
DEAD = "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWKgAw6iPyzty22P3zECxDRnmrrQJAoYkTFWUhMktPY4gA"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(port: int) -> LearnerConfig:
    return load_config(LearnerConfig, None, [
        f'network.listen="/ip4/127.0.0.1/tcp/{port}"', f'run.name="{RUN}"',
        "train.steps=1", "train.prompts_per_step=2", "train.group_size=2", "train.max_tokens=8",
        "train.micro_batch=4", "train.checkpoint_every=0", "sync.long_poll_s=1.0", 'dissem.mode="direct"',
        "dashboard.enabled=false",
        "sync.min_waiting_nodes=2",  # no lease before both nodes wait: node 2 must join first
    ])


def spawn(tmp: Path, name: str, *flags: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "node_agents.cli", "join", *flags, "--data-dir", str(tmp / name),
           "--threads", "1", "--name", name, "--model", "default", "--no-probe", "--max-retries", "40",
           "--listen", "/ip4/127.0.0.1/tcp/0", "--once", "--priority", "normal"]
    log = open(tmp / f"{name}.log", "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


async def wait_for(predicate, what: str, timeout: float = 120.0):
    with trio.fail_after(timeout):
        while not (value := predicate()):
            await trio.sleep(0.3)
    return value


async def watch(procs: dict[str, subprocess.Popen], until) -> None:
    """Fail at once if a node that should keep running exits with an error."""
    while not until():
        for name in ("n1", "n2"):
            rc = procs[name].poll() if name in procs else None
            if rc not in (None, 0):
                raise AssertionError(f"node {name} exited with {rc}")
        await trio.sleep(0.5)


async def with_deadline(fn, *args, seconds: float = 300.0):
    with trio.fail_after(seconds):
        await fn(*args)


def listening_addr(log: Path) -> str | None:
    """The first address of a node's ``listening on <peer id> <addr> ...`` line."""
    for line in log.read_text().splitlines():
        if line.startswith("swarm-node: listening on "):
            return line.split()[4]
    return None


def test_bootstrap_through_a_node_wrong_run_and_learner_restart(tmp_path):
    port, key_dir = free_port(), tmp_path / "learner-key"
    procs: dict[str, subprocess.Popen] = {}
    peer_ids: list[str] = []
    lines: list[str] = []

    async def phase(run_dir: Path, first: bool) -> None:
        services: list = []

        def on_service(service) -> None:
            services.append(service)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, procs, lambda: bool(services) and services[0].done)
            addrs = await nursery.start(lambda task_status: run_learner(
                config(port), run_dir, data_dir=key_dir, console=lines.append, on_service=on_service,
                task_status=task_status))
            peer_ids.append(split_peer_id(addrs[0])[1])
            if not first:
                return  # the learner trains its step with both nodes, tells them it is done, returns
            procs["n1"] = spawn(tmp_path, "n1", "--bootstrap", addrs[0], "--run", RUN)
            n1_addr = await wait_for(lambda: listening_addr(tmp_path / "n1.log"), "node 1's address")
            procs["n2"] = spawn(tmp_path, "n2", "--bootstrap", DEAD, "--bootstrap", n1_addr)
            procs["wrong"] = spawn(tmp_path, "wrong", "--learner", addrs[0], "--run", "another-run")
            await wait_for(lambda: len(services[0].roster) == 2, "both nodes joined")
            await wait_for(lambda: procs["wrong"].poll() is not None, "the wrong-run node to exit")
            nursery.cancel_scope.cancel()  # the learner goes away mid-run

    try:
        trio.run(with_deadline, phase, tmp_path / "run1", True)
        trio.run(with_deadline, phase, tmp_path / "run2", False)
        for name in ("n1", "n2"):
            procs[name].wait(timeout=120)
    finally:
        stop_processes(list(procs.values()), 5.0)

    logs = {name: (tmp_path / f"{name}.log").read_text() for name in procs}
    assert peer_ids[0] == peer_ids[1], "same data dir, same peer id"
    assert procs["wrong"].returncode == 2, logs["wrong"]
    assert f"trains run '{RUN}', not 'another-run'" in logs["wrong"]
    n2 = logs["n2"]
    assert f"bootstrap {DEAD} unreachable" in n2
    assert f"is in run '{RUN}'" in n2
    assert f"found the learner of run '{RUN}' in the DHT: {peer_ids[0][-6:]}" in n2
    # n2 was given no learner id: it took the one node 1 named and pinned it (trust on first use).
    assert f"pinned learner {peer_ids[0]} for run '{RUN}'" in n2 and "(trust on first use)" in n2
    for name in ("n1", "n2"):
        assert procs[name].returncode == 0, logs[name]
        assert logs[name].count(f"joined learner {peer_ids[0][-6:]}") >= 2, logs[name]
        assert "run finished" in logs[name]
        listening = [ln for ln in logs[name].splitlines() if ln.startswith("swarm-node: listening on ")][0]
        assert "0.0.0.0" not in listening
    assert len(read_metrics(tmp_path / "run2" / "metrics.jsonl")) == 1
    assert any(ln.startswith(f"learner: listening on {peer_ids[0]} /ip4/127.0.0.1/tcp/{port}/p2p/") for ln in lines)
