"""An in-process learner with node processes beside it, for the integration tests: start the
learner (``learner.loop.run_learner``) on ``cfg``, spawn one ``swarm-node`` process per node once
it listens (through ``tests/integration/cheat_node.py`` for a cheating mode), wait for the run to
end, stop the nodes, and return what the tests look at."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import trio

from learner.config import LearnerConfig
from learner.demo import node_command, stop_processes
from learner.loop import run_learner
from learner.metrics import read_metrics

CHEAT = Path(__file__).with_name("cheat_node.py")


@dataclass(frozen=True)
class Node:
    """One node process: its name (data directory and log ``<name>.log``), the cheat mode of
    ``cheat_node.py`` (None: an honest ``swarm-node``), CPU threads, model and backend."""

    name: str
    mode: str | None = None
    threads: int = 1
    model: str = "default"
    backend: str | None = None
    #: Extra ``swarm-node join`` arguments.
    extra: tuple[str, ...] = ()
    #: ggml's OpenMP threads sleep instead of spinning at barriers (a 2-thread node on a loaded
    #: 2-core machine is 2.5x faster so; the same tokens: the split of the work is what counts).
    passive_omp: bool = False


def spawn(addr: str, tmp: Path, node: Node) -> subprocess.Popen:
    cmd = node_command(addr, tmp / node.name, node.threads, node.name, node.model, node.backend)
    cmd += ["--no-probe", "-v", *node.extra]
    if node.mode is not None:  # the same command line through the cheating wrapper
        cmd = [sys.executable, str(CHEAT), node.mode] + cmd[3:]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"} if node.passive_omp else None
    log = open(tmp / f"{node.name}.log", "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)


def run(tmp_path: Path, cfg: LearnerConfig, nodes: list[Node], seconds: float,
        also: Callable[[str], list[subprocess.Popen]] | None = None) -> dict:
    """The run to its end (``trio.TooSlowError`` after ``seconds``). ``also(learner address)``
    starts more processes beside the nodes (stopped with them). Returns ``svc`` (the learner's
    service), ``procs``, ``logs`` (node name -> its log's text), ``peer_of`` (node name -> peer id,
    from the node's ``[name] peer ...`` line; None if it never joined), the metrics ``rows`` and the
    work ledger ``work`` of ``swarm.json``."""
    procs: list[subprocess.Popen] = []
    seen: dict = {}

    async def main():
        with trio.fail_after(seconds):
            async with trio.open_nursery() as nursery:
                addrs = await nursery.start(lambda task_status: run_learner(
                    cfg, tmp_path / "run", console=lambda s: None,
                    on_service=lambda svc: seen.setdefault("svc", svc), task_status=task_status))
                for node in nodes:
                    procs.append(spawn(addrs[0], tmp_path, node))
                if also is not None:
                    procs.extend(also(addrs[0]))

    try:
        trio.run(main)
    finally:
        stop_processes(procs, 20)
    logs = {n.name: (tmp_path / f"{n.name}.log").read_text() for n in nodes}
    peer_of = {n.name: next((line.split()[2] for line in logs[n.name].splitlines()
                             if line.startswith(f"[{n.name}] peer ")), None) for n in nodes}
    run_dir = tmp_path / "run"
    swarm = run_dir / "swarm.json"
    return {"svc": seen["svc"], "procs": procs, "logs": logs, "peer_of": peer_of,
            "rows": read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else [],
            "work": json.loads(swarm.read_text()).get("work") if swarm.exists() else None}
