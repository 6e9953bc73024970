"""A node left running across two runs of the same learner joins the second by itself: real
``swarm-learner launch`` processes, one after the other with the same ``--data-dir`` (so the same
peer id) and port, and one real ``swarm-node join`` process (llama.cpp) left running between
them. Then ``swarm-node status`` shows both runs and the learner's account, ``--name`` is in the
second run's ``swarm.json``, and SIGTERM stops the node cleanly.

Slow (two learner start-ups, about 2-3 min on 2 cores): ``make test-slow``. The default suite
checks the same loop against a small learner of the real protocols
(``tests/node_agents/test_rejoin.py``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from learner.demo import stop_processes
from learner.metrics import read_metrics
from process_helpers import start, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800)]

CONFIG = ("[train]\nsteps = 1\nprompts_per_step = 2\ngroup_size = 2\nmax_tokens = 8\nmicro_batch = 4\n"
          "checkpoint_every = 0\n[verify]\nenabled = false\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp: Path, port: int, run: str) -> subprocess.Popen:
    return start([sys.executable, "-m", "learner.cli", "launch", "--config", str(tmp / "run.toml"),
                  "--run-dir", str(tmp / run), "--data-dir", str(tmp / "learner-key"), "--no-dashboard",
                  "--set", f'network.listen="/ip4/127.0.0.1/tcp/{port}"'], tmp / f"{run}.log")


def text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_a_node_left_running_joins_the_learners_next_run(tmp_path):
    (tmp_path / "run.toml").write_text(CONFIG)
    port = free_port()
    procs: list[subprocess.Popen] = []
    node_log = tmp_path / "node.log"
    try:
        first = launch(tmp_path, port, "run1")
        procs.append(first)
        addr = wait_for(lambda: re.search(rf"(/ip4/127\.0\.0\.1/tcp/{port}/p2p/\w+)", text(tmp_path / "run1.log")),
                        600, "the first learner to listen", [first]).group(1)
        node = start([sys.executable, "-m", "node_agents.cli", "join", "--learner", addr, "--data-dir",
                      str(tmp_path / "node"), "--threads", "1", "--name", "volunteer", "--model", "default",
                      "--no-probe", "--listen", "/ip4/127.0.0.1/tcp/0", "--priority", "normal"], node_log)
        procs.append(node)
        wait_for(lambda: first.poll() is not None, 900, "the first run to end", [node])
        assert first.returncode == 0, text(tmp_path / "run1.log")[-3000:]
        wait_for(lambda: "waiting for learner" in text(node_log), 120, "the node to wait for the next run", [node])
        assert node.poll() is None
        second = launch(tmp_path, port, "run2")  # the same identity and port
        procs.append(second)
        wait_for(lambda: second.poll() is not None, 900, "the second run to end", [node])
        assert second.returncode == 0, text(tmp_path / "run2.log")[-3000:]
        assert node.poll() is None, text(node_log)[-3000:]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        status = subprocess.run([sys.executable, "-m", "node_agents.cli", "status", "--data-dir",
                                 str(tmp_path / "node")], capture_output=True, text=True, env=env, timeout=60)
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=60) == 0, text(node_log)[-3000:]
    finally:
        stop_processes(procs, 10)
    log = text(node_log)
    peer = re.search(r"\[volunteer\] peer (\w+)", log).group(1)
    runs = re.findall(r"\(run (\w+), model", log)
    assert len(set(runs)) == 2, log  # joined two runs (two run ids) in one life
    assert log.count("run finished:") == 2 and "stopping (SIGTERM)" in log
    for run in ("run1", "run2"):
        rows = read_metrics(tmp_path / run / "metrics.jsonl")
        assert [r["step"] for r in rows] == [1] and rows[0]["nodes"] == {peer: 4}, rows
    swarm = json.loads((tmp_path / "run2" / "swarm.json").read_text())
    assert swarm["nodes"][peer]["name"] == "volunteer" and swarm["work"][peer]["name"] == "volunteer"
    out = status.stdout
    assert status.returncode == 0 and "node:     volunteer" in out and "running (pid" in out, out
    assert "over 2 run(s)" in out and "name as the operator sees it: volunteer" in out, out
    assert "state:    not running" in subprocess.run(
        [sys.executable, "-m", "node_agents.cli", "status", "--data-dir", str(tmp_path / "node")],
        capture_output=True, text=True, env=env, timeout=60).stdout
