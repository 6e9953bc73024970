"""``swarm-bench load`` at a small scale: 30 simulated nodes (real libp2p hosts, 3 worker
processes) dial one learner service all at once; every node joins and gets work, every group is
trained exactly once and acknowledged to the node that pushed it. (The 200-node run is a benchmark:
docs/benchmarks.md.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

NODES, GROUPS = 30, 300


@pytest.mark.slow
def test_thirty_nodes_dialling_at_once_all_join_and_every_group_is_accounted_for(tmp_path: Path):
    out = tmp_path / "load.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.cli", "load", "--nodes", str(NODES), "--per-process", "10",
         "--groups", str(GROUPS), "--join-stagger-ms", "0", "--gen-ms", "100", "--timeout", "240",
         "--json", str(out)],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    f = json.loads(out.read_text())
    assert f["nodes_joined"] == NODES and f["nodes_with_work"] == NODES and f["nodes_gave_up"] == 0
    assert f["ledger"] == {"trained": GROUPS} and f["accepted_by_nodes"] == GROUPS
    assert f["workers_ok"] == 3 and f["leases_per_s"] > 0 and f["lease_p50_ms"] <= f["lease_p99_ms"]
    assert f["learner_rss_mib"] < 512
