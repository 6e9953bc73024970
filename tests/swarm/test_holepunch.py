"""What circuit relay v2 + DCUtR (py-libp2p 0.8) do between a public peer and a peer behind
a masquerading NAT, on echo-swarm's host stack, in emulated hosts (see docs/deploy.md,
"Hole punching"). Not wired into the swarm: this pins down the behaviour the docs report.

Found: a connection through the relay works; DCUtR's own exchange fails on this stack, yet a
direct connection appears, opened from the NAT'd side (seen at its router's address): the
NAT'd peer's DCUtR first dials the other peer's advertised address, and a dial out of a
masquerading NAT succeeds.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

PEER = [sys.executable, str(Path(__file__).with_name("holepunch_peer.py"))]


def peer_id(p: subprocess.Popen, log: Path) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = re.search(r"^ID (\S+)", log.read_text(), re.M)
        if m:
            return m.group(1)
        assert p.poll() is None, log.read_text()
        time.sleep(0.2)
    raise AssertionError(log.read_text())


def test_relay_then_direct_connection_from_the_nat_side(netns_hosts, tmp_path):
    tb = netns_hosts(3, nat_hosts=(2,))
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": "/usr/bin:/bin"}
    procs = []
    try:
        logs = {r: tmp_path / f"{r}.log" for r in ("relay", "listener", "dialer")}

        def start(i, role, *args):
            p = tb.popen(i, PEER + [role, *args], env=env, stdout=open(logs[role], "w"), stderr=subprocess.STDOUT)
            procs.append(p)
            return p

        relay = start(0, "relay", "120")
        raddr = f"/ip4/{tb.ip(0)}/tcp/8000/p2p/{peer_id(relay, logs['relay'])}"
        listener = start(2, "listener", raddr, "90")
        lid = peer_id(listener, logs["listener"])
        deadline = time.monotonic() + 60
        while '"reserved": true' not in logs["listener"].read_text():
            assert time.monotonic() < deadline and listener.poll() is None, logs["listener"].read_text()
            time.sleep(0.2)
        dialer = start(1, "dialer", raddr, lid)
        dialer.wait(timeout=120)
        out = [json.loads(line) for line in logs["dialer"].read_text().splitlines() if line.startswith("{")]
        assert out, logs["dialer"].read_text()[-3000:]
        res = out[-1]
        assert any("/p2p-circuit/" in a for c in res["relayed"] for a in c), res  # through the relay
        direct = [a for c in res["after"] for a in c if "/p2p-circuit/" not in a]
        assert direct and all(a.startswith(f"/ip4/{tb.public_ip(2)}/tcp/") for a in direct), res
    finally:
        for p in procs:
            p.kill()
            p.wait()
