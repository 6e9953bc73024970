"""Reachability by dial-back: the pure choice of addresses, real dial-backs on loopback, and
in emulated hosts: a public node is reachable, a node behind NAT is not (though it can dial
out), each measured by a fresh dial from another namespace."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import trio

from swarm.discovery.reach import candidate_addrs, dial_back
from swarm.host import open_host

PID = "12D3KooWGzXfVYNRZ4rhpbNj6D3vQPWmhF6Y1d3mNb2Jd6U2D3Kx"
OTHER = "12D3KooWRBhwfeP2Y4TCx1SM6s9rUoHhR5STiGwxBhgFRcw3UERE"


def test_candidates_drop_unusable_and_foreign_addresses():
    addrs = ["/ip4/0.0.0.0/tcp/4001", "/ip4/192.0.2.7/tcp/4001", f"/ip4/192.0.2.8/tcp/4001/p2p/{OTHER}",
             "/ip4/127.0.0.1/tcp/4001", "/ip4/192.0.2.7/tcp/4001", f"/ip4/198.51.100.1/tcp/9/p2p/{PID}",
             "/ip4/192.0.2.9/tcp/0", "/ip4/192.0.2.9/udp/4001/quic", "garbage", 42]
    assert candidate_addrs(addrs, PID, "203.0.113.5") == [
        f"/ip4/192.0.2.7/tcp/4001/p2p/{PID}", f"/ip4/198.51.100.1/tcp/9/p2p/{PID}"]
    # from this machine, loopback is worth a try too
    assert f"/ip4/127.0.0.1/tcp/4001/p2p/{PID}" in candidate_addrs(addrs, PID, "127.0.0.1")
    assert candidate_addrs(["/ip4/127.0.0.1/tcp/4001"], PID, None) == []
    many = [f"/ip4/192.0.2.{i}/tcp/1" for i in range(1, 30)]
    assert len(candidate_addrs(many, PID, "192.0.2.200", limit=5)) == 5


def test_dial_back_on_loopback(tmp_path):
    async def main():
        async with open_host(tmp_path / "node") as node:
            ok = await dial_back(node.peer_id, node.addrs, "127.0.0.1", timeout_s=3)
            assert ok.reachable and ok.addr in node.addrs, ok
            # the same addresses claimed by another peer id: the handshake exposes it
            wrong = await dial_back(OTHER, [a.split("/p2p/")[0] for a in node.addrs], "127.0.0.1", timeout_s=3)
            assert not wrong.reachable and wrong.tried, wrong
            # a closed port
            port = node.addrs[0].split("/tcp/")[1].split("/")[0]
            closed = await dial_back(node.peer_id, [f"/ip4/127.0.0.1/tcp/{int(port) ^ 1}"], "127.0.0.1", timeout_s=2)
            assert not closed.reachable and "failed" in closed.summary()
            # nothing dialable advertised: no dial at all
            none = await dial_back(node.peer_id, ["/ip4/0.0.0.0/tcp/1"], "127.0.0.1")
            assert not none.reachable and none.tried == () and "no dialable" in none.summary()

    trio.run(main)


def serve(tb, i, tmp_path, *extra: str) -> tuple[subprocess.Popen, list[str]]:
    p = tb.popen(i, [sys.executable, "-m", "swarm.discovery.reach", "--serve", "--listen", "/ip4/0.0.0.0/tcp/4001",
                     *extra],
                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(tmp_path / f"serve{i}.log", "w"), text=True)
    addrs = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = p.stdout.readline().strip()
        if line == "ready" or not line:
            break
        addrs.append(line)
    assert addrs, (tmp_path / f"serve{i}.log").read_text()
    return p, addrs


def probe(tb, i, addrs) -> dict:
    res = tb.run(i, [sys.executable, "-m", "swarm.discovery.reach", "--timeout", "2", *addrs], timeout=60)
    return json.loads(res.stdout)


def test_dial_back_between_emulated_hosts(netns_hosts, tmp_path):
    tb = netns_hosts(3, nat_hosts=(2,))
    procs = []
    try:
        pub, pub_addrs = serve(tb, 1, tmp_path)
        nat, nat_addrs = serve(tb, 2, tmp_path)
        procs += [pub, nat]
        assert any(tb.ip(1) in a for a in pub_addrs) and any(tb.ip(2) in a for a in nat_addrs)
        assert not any("0.0.0.0" in a for a in pub_addrs + nat_addrs)
        seen = probe(tb, 0, pub_addrs)
        assert seen["reachable"] and tb.ip(1) in seen["addr"], seen
        seen = probe(tb, 0, nat_addrs)
        assert not seen["reachable"] and seen["errors"], seen
        # it is not down: from inside its own namespace it answers, and it can dial out
        assert probe(tb, 2, nat_addrs)["reachable"]
        assert probe(tb, 2, pub_addrs)["reachable"]
    finally:
        for p in procs:
            p.stdin.close()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def test_port_forward_and_announce_make_a_nat_host_reachable(netns_hosts, tmp_path):
    tb = netns_hosts(2, nat_hosts=(1,))
    tb.forward_port(1, 4001)
    p, addrs = serve(tb, 1, tmp_path, "--announce", f"/ip4/{tb.public_ip(1)}/tcp/4001")
    try:
        assert addrs[0].startswith(f"/ip4/{tb.public_ip(1)}/tcp/4001/p2p/"), addrs  # announced first
        seen = probe(tb, 0, addrs)
        assert seen["reachable"] and tb.public_ip(1) in seen["addr"], seen
    finally:
        p.stdin.close()
        p.wait(timeout=10)
