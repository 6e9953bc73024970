"""Faults while a run goes on, all real OS processes over real libp2p on 127.0.0.1: the learner
(``swarm-learner launch``) is killed with SIGKILL after a checkpoint and restarted with
``--resume`` on the same address while the ``swarm-node`` processes stay up; a node is killed
and replaced meanwhile. The run finishes, no step appears twice in ``metrics.jsonl``, and every
step trains a full batch."""

from __future__ import annotations

import json
import random
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from learner.demo import node_command, stop_processes
from learner.metrics import read_metrics
from process_helpers import start, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS, PROMPTS, GROUP = 4, 2, 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def learner_cmd(cfg: Path, run_dir: Path, port: int, resume: bool) -> list[str]:
    return [sys.executable, "-m", "learner.cli", "launch", "--config", str(cfg), "--run-dir", str(run_dir),
            "--data-dir", str(run_dir.parent / "learner-data"), "--no-dashboard",  # the same key across restarts
            "--set", f'network.listen="/ip4/127.0.0.1/tcp/{port}"'] + (["--resume"] if resume else [])


def rows_of(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return read_metrics(path) if path.exists() else []


def test_learner_kill_and_resume_while_nodes_stay_up(tmp_path):
    rng = random.Random(0)
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        f"[train]\nsteps = {STEPS}\nprompts_per_step = {PROMPTS}\ngroup_size = {GROUP}\nmax_tokens = 12\n"
        "micro_batch = 4\ncheckpoint_every = 2\n"
        "[sync]\nmode = \"async\"\nmax_staleness = 1\nlong_poll_s = 1.0\nlease_timeout_s = 90.0\n")
    run_dir, port = tmp_path / "run", free_port()
    learner = start(learner_cmd(cfg, run_dir, port, False), tmp_path / "learner-1.log")
    nodes: list[subprocess.Popen] = []
    try:
        line = wait_for(lambda: re.search(r"(/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+)", (tmp_path / "learner-1.log").read_text()),
                        240, "the learner to listen", [learner])
        addr = line.group(1)

        def node(name: str) -> subprocess.Popen:
            cmd = node_command(addr, tmp_path / name, 1, name, "default") + ["--no-probe", "-v"]
            cmd[cmd.index("--max-retries") + 1] = "30"
            return start(cmd, tmp_path / f"{name}.log")

        nodes += [node("n0"), node("n1")]
        wait_for(lambda: len(rows_of(run_dir)) >= 1, 500, "step 1", [learner])
        victim = nodes[rng.randrange(2)]  # a random node dies mid-run and another takes its place
        victim.send_signal(signal.SIGKILL)
        nodes.append(node("n2"))
        # Kill the learner after step 3's row is written but with only step 2 checkpointed, so
        # the resume has to cut a metrics row and re-issue the in-flight groups.
        wait_for(lambda: len(rows_of(run_dir)) >= 3, 600, "step 3", [learner])
        learner.send_signal(signal.SIGKILL)
        learner.wait()
        assert (run_dir / "checkpoints" / "step_2" / "open_groups.json").exists()
        in_flight = json.loads((run_dir / "checkpoints" / "step_2" / "open_groups.json").read_text())
        assert in_flight, "an async run has groups in flight at a checkpoint"
        learner = start(learner_cmd(cfg, run_dir, port, True), tmp_path / "learner-2.log")
        assert learner.wait(timeout=900) == 0, (tmp_path / "learner-2.log").read_text()[-3000:]
    finally:
        learner.kill() if learner.poll() is None else None
        stop_processes(nodes, 30)
    rows = rows_of(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["samples"] == PROMPTS * GROUP for r in rows)
    ledger = json.loads((run_dir / "ledger.json").read_text())
    assert ledger["trained"] == (STEPS - 2) * PROMPTS
    assert set(ledger) <= {"trained", "pending", "leased", "held", "completed", "dropped:stale", "dropped:evicted"}
    run = json.loads((run_dir / "run.json").read_text())
    assert run["restarts"] == 1
    survivors = [p for p in nodes if p is not victim]
    logs = {p.args[p.args.index("--name") + 1]: (tmp_path / f"{p.args[p.args.index('--name') + 1]}.log").read_text()
            for p in survivors}
    # the nodes that were up when the learner died carried on with the resumed learner
    assert all(p.returncode == 0 for p in survivors), logs
    assert any(f"run {run['run_id']}~1" in text for text in logs.values()), logs
