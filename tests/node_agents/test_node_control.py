"""A node's data dir as the meeting point of the running node and ``swarm-node pause | resume |
status`` (``node_agents/control.py``, ``node_agents/record.py``, ``node_agents/status_cli.py``):
the lock, the owner's pause file, the record, and the commands as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from node_agents import control
from node_agents.record import MAX_RUNS, NodeRecord, read_record
from node_agents.status_cli import status_lines

HOLD = "import sys, time; from node_agents.control import NodeLock\nwith NodeLock(sys.argv[1]):\n" \
       "    print('held', flush=True); time.sleep(60)\n"


def node_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-m", "node_agents.cli", *args], capture_output=True, text=True, env=env,
                          timeout=60)


@pytest.fixture
def holder(tmp_path):
    """Another process holding the node's lock, as a running node does."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline().strip() == "held"
    yield p
    p.kill()
    p.wait()


def test_one_node_per_data_dir(tmp_path, holder):
    assert control.running(tmp_path) == holder.pid
    with pytest.raises(control.AlreadyRunning, match=f"another swarm-node \\(pid {holder.pid}\\) runs with data dir"):
        with control.NodeLock(tmp_path):
            pass
    holder.kill()
    holder.wait()
    assert control.running(tmp_path) is None  # a dead holder's lock is gone with it
    with control.NodeLock(tmp_path):
        assert control.running(tmp_path) == os.getpid()


def test_owner_pause_file(tmp_path):
    assert control.owner_pause(tmp_path) is None
    control.pause(tmp_path, "a video call\x07")
    assert control.owner_pause(tmp_path) == "a video call"  # printable only
    (tmp_path / control.PAUSE_FILE).write_text("not json")
    assert control.owner_pause(tmp_path) == ""  # still paused
    assert control.resume(tmp_path) and not control.resume(tmp_path)
    assert control.owner_pause(tmp_path) is None


def test_record_accumulates_over_runs_and_restarts(tmp_path):
    now = [1000.0]
    rec = NodeRecord(tmp_path, clock=lambda: now[0])
    rec.started("12D3KooWpeer", "box")
    rec.joined("r1", "arith", "12D3KooWlearner", "/ip4/1.2.3.4/tcp/4001/p2p/12D3KooWlearner")
    rec.pushed("r1", 2, 1, 6, 300)
    rec.state("paused", "on battery")
    rec.stopped()
    again = NodeRecord(tmp_path, clock=lambda: now[0])  # the next start of the node
    again.started("12D3KooWpeer", "box")
    again.joined("r2", "arith", "12D3KooWlearner")
    again.pushed("r2", 1, 0, 2, 100)
    data = read_record(tmp_path)
    assert data["totals"] == {"leases": 2, "groups_pushed": 4, "groups_rejected": 1, "completions_pushed": 8,
                              "tokens": 400}
    assert [(r["run_id"], r["groups_pushed"], r["tokens"]) for r in data["runs"]] == [("r1", 3, 300), ("r2", 1, 100)]
    assert data["state"] == "working" and data["last_learner"]["peer_id"] == "12D3KooWlearner"
    for i in range(MAX_RUNS + 5):
        again.joined(f"x{i}", "", "12D3KooWlearner")
    assert len(read_record(tmp_path)["runs"]) == MAX_RUNS
    (tmp_path / "node_status.json").write_text("{broken")
    assert read_record(tmp_path) == {} and NodeRecord(tmp_path).data["totals"]["tokens"] == 0


def test_status_lines_show_the_record_and_the_learners_account(tmp_path):
    rec = NodeRecord(tmp_path, clock=lambda: 1000.0)
    rec.started("12D3KooWpeer", "box")
    rec.joined("r1", "arith", "12D3KooWlearner", "/ip4/1.2.3.4/tcp/4001/p2p/12D3KooWlearner")
    rec.pushed("r1", 5, 1, 12, 640)
    lines = status_lines(read_record(tmp_path), 4242, None, tmp_path, 1010.0)
    text = "\n".join(lines)
    assert "node:     box (peer 12D3KooWpeer)" in text and "running (pid 4242), working: run arith" in text
    assert "pushed:   6 groups (1 rejected at the push) in 1 leases, 12 rollouts, 640 tokens, over 1 run(s)" in text
    assert "the learner's account: not asked yet" in text
    rec.learner_view({"known": True, "run_id": "r1", "run_name": "arith", "name": "box", "groups_pushed": 6,
                      "groups_rejected": 1, "groups_trained": 4, "tokens_generated": 640,
                      "verified": {"replay": 2, "stats": 1}, "failed": {}, "untrusted": ""})
    text = "\n".join(status_lines(read_record(tmp_path), None, "lunch", tmp_path, 1010.0))
    assert "state:    not running" in text and "paused:   by the owner (lunch); swarm-node resume" in text
    assert "name as the operator sees it: box" in text and "trained 4, tokens 640" in text
    assert "verified by test: replay 2, stats 1; failed: none" in text
    assert status_lines({}, None, None, tmp_path, 0.0)[1] == "no record: no node has run with this data dir yet"


def test_pause_resume_and_status_commands(tmp_path, holder):
    NodeRecord(tmp_path).started("12D3KooWpeer", "box")
    t0 = time.monotonic()
    out = node_cli("pause", "--data-dir", str(tmp_path), "--reason", "gaming", "--wait", "0.5")
    assert out.returncode == 0 and f"node pid {holder.pid} pauses once the lease in hand is pushed" in out.stdout
    assert time.monotonic() - t0 < 30 and control.owner_pause(tmp_path) == "gaming"
    status = node_cli("status", "--data-dir", str(tmp_path))
    assert status.returncode == 0 and f"running (pid {holder.pid})" in status.stdout and "(gaming)" in status.stdout
    as_json = json.loads(node_cli("status", "--data-dir", str(tmp_path), "--json").stdout)
    assert as_json["running_pid"] == holder.pid and as_json["owner_pause"] == "gaming" and as_json["name"] == "box"
    out = node_cli("resume", "--data-dir", str(tmp_path))
    assert f"node pid {holder.pid} resumed" in out.stdout and control.owner_pause(tmp_path) is None
    holder.kill()
    holder.wait()
    out = node_cli("pause", "--data-dir", str(tmp_path))
    assert "no node runs with data dir" in out.stdout and "starts paused" in out.stdout
    assert "was not paused" in node_cli("resume", "--data-dir", str(tmp_path / "other")).stdout
