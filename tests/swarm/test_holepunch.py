"""Hole punching on echo-swarm's hosts across emulated hosts (``bench/netns.py``), real
processes (``bench/holepunch_peer.py``): a public relay; a peer behind an endpoint-independent
(EIM) router reserves a slot there; peers behind another EIM router, behind a symmetric router
and on the public network open a circuit to it through the relay and punch
(``swarm.nat.service.NatService.punch``: DCUtR, TCP simultaneous open, up to 3 attempts with
backoff, as a node makes them; ``swarm-bench holepunch`` measures first attempts).

Expected, and what a home network gives: EIM <-> EIM punches (the direct connection comes from
the far router's public address and the listener's own port); public -> EIM too; symmetric <->
EIM does not (the symmetric router gives the dial a port nobody could predict), and the
failure is reported, not raised.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.netns import RouterSpec

ROOT = Path(__file__).resolve().parents[2]
PEER = [sys.executable, "-m", "bench.holepunch_peer"]
ENV = {"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def test_punch_through_eim_routers_and_not_through_a_symmetric_one(netns_hosts, tmp_path):
    # hosts: 0 relay, 1 public puncher, 2 listener (EIM), 3 puncher (EIM), 4 puncher (symmetric)
    tb = netns_hosts(2, routers=(RouterSpec("eim"), RouterSpec("eim"), RouterSpec("symmetric")))
    procs = []
    try:
        def serve(i, *args):
            p = tb.popen(i, PEER + list(args), env=ENV, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=open(tmp_path / f"h{i}.err", "w"), text=True)
            procs.append(p)
            line = p.stdout.readline().split()
            assert len(line) == 2, (tmp_path / f"h{i}.err").read_text()[-3000:]
            return line[1]

        relay = serve(0, "relay", "4001")
        circuit = serve(2, "listen", "4002", relay)
        listener = circuit.rsplit("/p2p/", 1)[1]
        punchers = {i: tb.popen(i, PEER + ["punch", relay, listener, "1", "8", "3"], env=ENV, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (1, 3, 4)}
        out = {}
        for i, p in punchers.items():
            stdout, stderr = p.communicate(timeout=240)
            lines = [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]
            assert p.returncode == 0 and len(lines) == 1, stderr[-3000:]
            out[i] = lines[0]
        for i in (1, 3):  # public and EIM: a direct connection to the listener's router, its own port
            assert out[i]["ok"] and out[i]["how"] == "punched", out[i]
            assert out[i]["addr"] == f"/ip4/{tb.public_ip(2)}/tcp/4002", out[i]
        assert not out[4]["ok"] and out[4]["how"] == "failed" and out[4]["attempts"] == 3 and out[4]["reason"], out[4]
    finally:
        for p in procs:
            p.stdin.close()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
