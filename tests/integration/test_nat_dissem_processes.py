"""Adapter dissemination with most nodes behind NAT, across emulated hosts and real processes.

The learner's dissemination side (``bench.relay_node learner``: the real ``LearnerDissem``, the
circuit relay, the link planner) on a public host; 8 nodes (``bench.relay_node node``: the real
``AdapterSync`` and ``NatService`` on real libp2p hosts): 2 public, 2 behind each of two
endpoint-independent ("eim", punchable) routers, 2 behind one symmetric router. Once the nodes
registered, each NAT'd one reserves at the learner's relay and hole-punches to the other NAT'd
ones when the learner asks; then 3 adapter versions are pushed down the tree the learner plans
along the links. What must hold, from the nodes' own reports and the learner's summary and log:

- every node holds every version;
- every node behind an eim router relayed adapter chunks to another node (it is named as a
  sender in another node's completion report) and its role says it punched holes;
- every node behind the symmetric router relayed nothing: its role is a leaf, and both the
  summary and the learner's log say why (every hole punch failed, symmetric NAT likely).

Slow: about 5 minutes on a loaded 2-core machine (the punch rounds take most of it).

Every node listens on its own port. Hosts behind one (Linux masquerade) router that listen on the
same port share the address DCUtR advertises (router address : listening port), so only one of
them could hold a direct connection to a given peer: with every node on 4001 only each host's
first punch succeeded and this test failed (``tests/swarm/nat/test_repeated_punches.py`` pins
both). 2026-11-25, load about 11: passed in 163 s; all 4 pairs across the two eim routers
punched (5.4-6.1 s each), 18 punch attempts recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.netns import RouterSpec

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = 3


def wait_line(path: Path, prefix: str, proc: subprocess.Popen, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in (path.read_text() if path.exists() else "").splitlines():
            if line.startswith(prefix):
                return line[len(prefix):].strip()
        assert proc.poll() is None, f"{path.name}: exited with {proc.returncode}:\n{path.read_text()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"no {prefix!r} line in {path} within {timeout_s} s")


def test_nat_nodes_relay_and_symmetric_ones_are_leaves(netns_hosts, tmp_path):
    tb = netns_hosts(3, rate_mbit=20, routers=(RouterSpec("eim", 2), RouterSpec("eim", 2), RouterSpec("symmetric", 2)))
    eim, sym = tb.behind(0) + tb.behind(1), tb.behind(2)
    trials = [{"mode": "tree", "n": 8, "rank": 8, "codec": "fp16", "fan_out": 2, "stripes": 0,
               "chunk_bytes": 128 * 1024, "set": "all", "links": True, "stall_timeout_s": 3.0}] * VERSIONS
    (tmp_path / "trials.json").write_text(json.dumps(trials))
    py = [sys.executable, "-m", "bench.relay_node"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs: list[subprocess.Popen] = []
    try:
        learner = tb.popen(0, py + ["learner", "--nodes", "8", "--trials", str(tmp_path / "trials.json"),
                                    "--out", str(tmp_path / "rows.jsonl"), "--data-dir", str(tmp_path / "learner"),
                                    "--listen", f"/ip4/{tb.ip(0)}/tcp/4001", "--addr-file", str(tmp_path / "addr"),
                                    "--sets", str(tmp_path / "sets.json"), "--summary", str(tmp_path / "dissem.json"),
                                    "--punch-wait", "240", "-v"],
                           env=env, stdout=open(tmp_path / "learner.log", "w"), stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, cwd=ROOT)
        procs.append(learner)
        addr = wait_line(tmp_path / "learner.log", "learner ", learner, 60)
        hosts = [1, 2] + eim + sym
        for i in hosts:
            procs.append(tb.popen(i, py + ["node", "--learner", addr, "--run-id", "bench", "-v",
                                           "--data-dir", str(tmp_path / f"n{i}"), "--listen",
                                           f"/ip4/{tb.ip(i)}/tcp/{4100 + i}"],
                                  env=env, stdin=subprocess.PIPE, stdout=open(tmp_path / f"n{i}.log", "w"),
                                  stderr=subprocess.STDOUT, cwd=ROOT))
        ids = {i: wait_line(tmp_path / f"n{i}.log", "peer ", p, 120) for i, p in zip(hosts, procs[1:])}
        (tmp_path / "sets.json").write_text(json.dumps({"all": [ids[i] for i in hosts]}))
        learner.wait(timeout=600)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    log = (tmp_path / "learner.log").read_text()
    assert learner.returncode == 0, log[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == VERSIONS and all(r["ok"] and r["nodes_done"] == 8 for r in rows), rows
    summary = json.loads((tmp_path / "dissem.json").read_text())
    roles = summary["links"]["roles"]
    senders: dict[str, int] = {}
    for v in summary["versions"].values():
        for peer, report in v["have"].items():
            for src, n in report["sources"].items():
                if src != peer and n > 0:
                    senders[src] = senders.get(src, 0) + n
    for i in eim:
        peer = ids[i]
        assert roles[peer]["kind"] == "punched", roles[peer]
        assert senders.get(peer, 0) > 0, f"eim node {peer[-6:]} relayed no chunk: {senders}"
    for i in sym:
        peer = ids[i]
        assert roles[peer]["kind"] == "leaf" and not roles[peer]["relay"], roles[peer]
        assert "every hole punch failed" in roles[peer]["why"] and "symmetric" in roles[peer]["why"]
        assert peer not in senders, f"symmetric node {peer[-6:]} relayed chunks"
        assert f"links: {peer[-6:]} may not relay (a leaf)" in log and "every hole punch failed" in log
    assert all(summary["links"]["roles"][ids[i]]["kind"] == "dialable" for i in (1, 2))
    assert any(d["connected"] for d in summary["links"]["dials"])  # connection reversals were asked and made
