"""The emulated-host harness: public hosts reach each other, a NAT'd host dials out (and is
seen at its router's address) but cannot be dialled, shaping limits the rate, and every
namespace is gone afterwards."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.netns import Testbed as Bed
from bench.netns import missing, namespaces

SERVE = ("import socket,sys;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
         "s.bind(('0.0.0.0',int(sys.argv[1])));s.listen();s.settimeout(float(sys.argv[2]));"
         "c,a=s.accept();print(a[0],flush=True);n=0\n"
         "while True:\n d=c.recv(65536)\n if not d: break\n n+=len(d)\nprint(n,flush=True)")
SEND = ("import socket,sys,time;c=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=3);"
        "n=int(sys.argv[3]);t=time.time();c.sendall(b'x'*n);c.shutdown(socket.SHUT_WR);c.recv(1);"
        "print(time.time()-t)")


def serve(tb: Bed, i: int, port: int, wait_s: float = 5.0) -> subprocess.Popen:
    p = tb.popen(i, [sys.executable, "-c", SERVE, str(port), str(wait_s)], stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    return p


def send(tb: Bed, i: int, ip: str, port: int, n: int = 1) -> subprocess.CompletedProcess:
    return tb.run(i, [sys.executable, "-c", SEND, ip, str(port), str(n)], timeout=60)


def test_public_and_nat_reachability(netns_hosts):
    tb = netns_hosts(3, nat_hosts=(2,))
    # public -> public
    srv = serve(tb, 1, 5001)
    assert send(tb, 0, tb.ip(1), 5001, 1000).returncode == 0
    out = srv.communicate(timeout=10)[0].split()
    assert out == [tb.ip(0), "1000"]
    # NAT'd -> public: allowed, seen at the router's public address
    srv = serve(tb, 0, 5002)
    assert send(tb, 2, tb.ip(0), 5002).returncode == 0
    assert srv.communicate(timeout=10)[0].split()[0] == tb.public_ip(2) != tb.ip(2)
    # public -> NAT'd: neither its private address nor its router's address answers
    srv = serve(tb, 2, 5003, wait_s=4)
    assert send(tb, 0, tb.ip(2), 5003).returncode != 0
    assert send(tb, 1, tb.public_ip(2), 5003).returncode != 0
    srv.wait(timeout=10)
    assert srv.returncode != 0  # the listener timed out: nothing ever arrived


def test_shaped_link_rate(netns_hosts):
    tb = netns_hosts(2, rate_mbit=20)
    srv = serve(tb, 1, 5004)
    n = 5_000_000
    res = send(tb, 0, tb.ip(1), 5004, n)
    assert res.returncode == 0, res.stderr
    seconds = float(res.stdout)
    srv.communicate(timeout=10)
    mbit = n * 8 / seconds / 1e6
    assert 12 < mbit < 22, f"{mbit:.1f} Mbit/s through a 20 Mbit/s tbf"


@pytest.mark.skipif(missing(nat=True) is not None, reason=f"emulated hosts unavailable: {missing(nat=True)}")
def test_cleanup_on_error():
    tb = Bed(2, nat_hosts=(1,))
    with pytest.raises(RuntimeError, match="boom"):
        with tb:
            names = list(tb.made)
            assert set(names) <= set(namespaces()) and len(names) == 4
            raise RuntimeError("boom")
    left = set(names) & set(namespaces())
    assert not left, f"namespaces left behind: {left}"


def test_bad_arguments():
    if missing():
        pytest.skip(missing())
    with pytest.raises(ValueError, match="nat_hosts"):
        with Bed(2, nat_hosts=(5,)):
            pass


# -- NAT routers shared by several hosts: the mapping each kind gives --------------------------
PEER_ADDR = ("import socket,sys;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
             "s.bind(('0.0.0.0',int(sys.argv[1])));s.listen();s.settimeout(float(sys.argv[2]))\n"
             "for _ in range(int(sys.argv[3])):\n c,a=s.accept();print(a[0],a[1],flush=True);c.close()")
# Two connections at once from one local port (SO_REUSEPORT), to two peers: what a libp2p host
# that dials from its listening port does.
TWO_FROM_ONE_PORT = (
    "import socket,sys\nsocks=[]\n"
    "for ip in sys.argv[2:]:\n"
    " c=socket.socket();c.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
    " c.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEPORT,1);c.bind(('0.0.0.0',int(sys.argv[1])))\n"
    " c.settimeout(5);c.connect((ip,6000));socks.append(c)\n"
    "for c in socks: c.recv(1)\n")


def observed(tb: Bed, i: int, local_port: int) -> list[tuple[str, int]]:
    """The (address, port) public hosts 0 and 1 see for one local port of host ``i``."""
    srvs = [tb.popen(p, [sys.executable, "-c", PEER_ADDR, "6000", "10", "1"], stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True) for p in (0, 1)]
    time.sleep(0.4)
    res = tb.run(i, [sys.executable, "-c", TWO_FROM_ONE_PORT, str(local_port), tb.ip(0), tb.ip(1)])
    assert res.returncode == 0, res.stderr
    out = []
    for s in srvs:
        ip, port = s.communicate(timeout=15)[0].split()
        out.append((ip, int(port)))
    return out


def test_router_kinds_map_as_named(netns_hosts):
    from bench.netns import RouterSpec

    tb = netns_hosts(2, routers=(RouterSpec("eim", hosts=2), RouterSpec("symmetric", hosts=2)))
    assert len(tb) == 6 and [tb.nat_kind(i) for i in range(6)] == ["public"] * 2 + ["eim"] * 2 + ["symmetric"] * 2
    assert tb.public_ip(2) == tb.public_ip(3) != tb.public_ip(4) == tb.public_ip(5)
    # endpoint-independent: both peers see the router's address and the same (kept) port
    eim = observed(tb, 2, 41001)
    assert eim == [(tb.public_ip(2), 41001)] * 2, eim
    # endpoint-dependent with random ports: two peers see two different ports
    sym = observed(tb, 4, 41002)
    assert {ip for ip, _ in sym} == {tb.public_ip(4)} and sym[0][1] != sym[1][1], sym
    # hosts behind one router reach each other on its LAN; nothing from outside reaches them
    srv = serve(tb, 3, 5005)
    assert send(tb, 2, tb.ip(3), 5005).returncode == 0
    assert srv.communicate(timeout=10)[0].split()[0] == tb.ip(2)
    for i in (3, 5):
        assert send(tb, 0, tb.public_ip(i), 5006).returncode != 0
    # a port forwarded on a shared router reaches the one host it names
    tb.forward_port(5, 5007)
    srv = serve(tb, 5, 5007)
    assert send(tb, 0, tb.public_ip(5), 5007).returncode == 0
    assert srv.communicate(timeout=10)[0].split()[0] == tb.ip(0)


def test_router_spec_checks_its_kind():
    from bench.netns import RouterSpec

    with pytest.raises(ValueError, match="router kind"):
        RouterSpec("full-cone")
    with pytest.raises(ValueError, match="hosts"):
        RouterSpec("eim", hosts=0)
