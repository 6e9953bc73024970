"""Many hole punches per host, as a node makes them: each NAT'd peer keeps one host for its
whole life (``bench.holepunch_peer mesh``), reserves at one public relay, and punches (or is
punched by) several peers in turn across emulated endpoint-independent routers
(``bench/netns.py``).

What it pins:

- one host punches three NAT'd peers behind two other routers, one after the other; a host
  that was punched punches others afterwards; a pair that punched, closed its connections and
  punches again gets a fresh direct connection. Every one of these is a real punch (not
  "already"), from the far router's public address and the peer's own listening port.
- the limit behind it: the routers are Linux masquerade, which keeps a connection's source port
  only while the public 5-tuple stays unique (as OpenWrt-style home routers do). DCUtR advertises
  ``router address : listening port``. Two hosts behind one router listening on the same port
  share that advertised address, so once one of them holds a direct connection to a peer, the
  other cannot punch to that peer's host (the 5-tuple is taken, and the router gives its SYN
  another port). This was why only a host's first punch succeeded in the NAT tests and
  benchmarks, whose hosts all listened on 4001; ``swarm-node`` listens on a random port by default.
- after a punch no relayed connection is left between the pair, on either side (the relay's
  circuit carried the signalling only and is given back at once).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.netns import RouterSpec

ROOT = Path(__file__).resolve().parents[3]
PEER = [sys.executable, "-m", "bench.holepunch_peer"]
ENV = {"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def test_one_host_punches_many_peers_and_a_pair_punches_twice(netns_hosts, tmp_path):
    # 0 relay (public); router A: 1, 2; router B: 3, 4; router C: 5. Host 2 listens on host 1's port.
    tb = netns_hosts(1, routers=(RouterSpec("eim", 2), RouterSpec("eim", 2), RouterSpec("eim", 1)))
    ports = {1: 4101, 2: 4101, 3: 4103, 4: 4104, 5: 4105}
    procs: dict[int, subprocess.Popen] = {}
    try:
        def start(i, *args):
            p = tb.popen(i, PEER + list(args), env=ENV, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=open(tmp_path / f"h{i}.err", "w"), text=True)
            procs[i] = p
            line = p.stdout.readline().split()
            assert len(line) == 2, (tmp_path / f"h{i}.err").read_text()[-3000:]
            return line[1]

        relay = start(0, "relay", "4001")
        ids = {i: start(i, "mesh", str(port), relay, "10", "1" if i == 2 else "2").rsplit("/p2p/", 1)[1]
               for i, port in ports.items()}

        def ask(a: int, line: str) -> dict:
            procs[a].stdin.write(line + "\n")
            procs[a].stdin.flush()
            got = procs[a].stdout.readline()
            assert got, (tmp_path / f"h{a}.err").read_text()[-3000:]
            return json.loads(got)

        def punched(a: int, b: int) -> None:
            out = ask(a, ids[b])
            assert out["ok"] and out["how"] == "punched", (a, b, out)
            assert out["addr"] == f"/ip4/{tb.public_ip(b)}/tcp/{ports[b]}", (a, b, out)
            # the punch's relayed connection carried its signalling only: closed on both sides
            assert out["relayed"] is False, (a, b, out)
            deadline = time.monotonic() + 10
            while (left := ask(b, "?" + ids[a]))["relayed"] and time.monotonic() < deadline:
                time.sleep(0.2)
            assert left["direct"] and not left["relayed"], (a, b, left)

        for b in (3, 4, 5):  # one host, three peers behind two routers, in turn
            punched(1, b)
        punched(3, 5)  # a host that was punched punches another
        punched(4, 5)  # the peer punched twice already is punched again by a third
        assert ask(1, "-" + ids[3]) == {"dropped": ids[3]}
        assert ask(3, "-" + ids[1]) == {"dropped": ids[1]}
        punched(3, 1)  # the same pair again, the other way round, after their connection closed
        # host 2 shares host 1's advertised address (router A : 4101); 1 <-> 3 hold that 5-tuple
        out = ask(2, ids[3])
        assert not out["ok"] and out["how"] == "failed" and out["reason"], out
    finally:
        for p in procs.values():
            p.stdin.close()
        for p in procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
