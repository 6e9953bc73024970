"""``swarm-node doctor`` across emulated hosts (``bench/netns.py``), real processes: a public
bootstrap peer serving the NAT checks and a relay, a second public peer (another observer), a
peer behind an endpoint-independent router holding a slot at the relay (the hole-punch
partner), and the doctor run on a public host, behind another EIM router and behind a
symmetric router. Each says what it found and exits 0 (relays and serves) or 1 (a leaf)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.netns import RouterSpec
from node_agents.doctor import DoctorReport, render
from swarm.nat.kinds import EIM, NatVerdict, Observation

ROOT = Path(__file__).resolve().parents[2]
PEER = [sys.executable, "-m", "bench.holepunch_peer"]
DOCTOR = [sys.executable, "-m", "node_agents.cli", "doctor"]
ENV = {"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def test_render_says_what_was_found_in_plain_words():
    rep = DoctorReport("12D3KooWabcdef", 4002, [Observation("12D3KooWxyz123", "203.0.113.7", 4002)] * 2,
                       NatVerdict(EIM, "2 peers see us at 203.0.113.7:4002"), False, "no answer", True,
                       "direct connection after 0.40 s", 9.5, 9.6)
    text = render(rep)
    assert "endpoint-independent" in text and "peers cannot dial this machine" in text
    assert "hole punch: worked" in text and "upload 9.5 Mbit/s" in text and "role: INTERIOR RELAY" in text
    assert rep.role.exit_code == 0
    assert DoctorReport(problems=["bootstrap x: PeerUnreachable"]).role.exit_code == 2


def test_doctor_on_public_eim_and_symmetric_hosts(netns_hosts, tmp_path):
    # 0 bootstrap (relay), 1 public observer, 2 doctor (public), 3 punch partner (EIM),
    # 4 doctor (another EIM router), 5 doctor (symmetric)
    tb = netns_hosts(3, routers=(RouterSpec("eim"), RouterSpec("eim"), RouterSpec("symmetric")))
    procs = []
    try:
        def serve(i, *args):
            p = tb.popen(i, PEER + list(args), env=ENV, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=open(tmp_path / f"h{i}.err", "w"), text=True)
            procs.append(p)
            line = p.stdout.readline().split()
            assert len(line) == 2, (tmp_path / f"h{i}.err").read_text()[-3000:]
            return line[1]

        boot = serve(0, "relay", "4001")
        serve(1, "join", "4001", boot)
        serve(3, "listen", "4002", boot)
        doctors = {i: tb.popen(i, DOCTOR + ["--bootstrap", boot, "--json", "--timeout", "8"], env=ENV, cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (2, 4, 5)}
        rep = {}
        for i, p in doctors.items():
            out, err = p.communicate(timeout=300)
            assert out.strip(), err[-3000:]
            rep[i] = (p.returncode, json.loads(out))
        code, pub = rep[2]
        assert pub["verdict"]["kind"] == "public" and pub["dialable"] is True, pub
        assert code == 0 and pub["role"]["role"] == "interior relay" and pub["up_mbit"] > 0, pub
        code, eim = rep[4]
        assert eim["verdict"]["kind"] == "eim" and eim["dialable"] is False, eim
        assert len({o["observer"] for o in eim["observations"]}) >= 2, eim
        assert {o["ip"] for o in eim["observations"]} == {tb.public_ip(4)}, eim
        assert eim["punched"] is True and code == 0 and eim["role"]["role"] == "interior relay", eim
        code, sym = rep[5]
        assert sym["verdict"]["kind"] == "symmetric" and sym["dialable"] is False, sym
        assert sym["punched"] is False and code == 1 and sym["role"]["role"] == "leaf", sym
        assert "symmetric" in sym["role"]["why"] and "forward" in sym["role"]["why"], sym
    finally:
        for p in procs:
            p.stdin.close()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
