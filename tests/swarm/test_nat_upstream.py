"""Pins the py-libp2p DCUtR behaviour that ``swarm.nat.dcutr.PunchingDCUtR`` overrides. When a
py-libp2p release changes it, a test here fails: then read ``swarm/nat/dcutr.py`` and see
whether the wrapper is still needed (or still right).

Upstream (0.8.1): every DCUtR service starts hole punches by itself, towards each peer it holds
only a relayed connection to, every 2 s, and stops after 3 attempts per peer; the wrapper
turns that off and gives each explicit attempt its own budget. Every upstream attempt first
dials the peer's known direct addresses and waits for them (its "unilateral upgrade"); the
wrapper skips that dial, which its callers have made already."""

from __future__ import annotations

import types

import trio
import trio.testing
from libp2p.relay.circuit_v2 import dcutr as upstream

from swarm.nat.dcutr import PunchingDCUtR

RELAYED = "/ip4/10.0.0.1/tcp/1/p2p/12D3KooWRelay/p2p-circuit"


class FakeConn:
    def get_transport_addresses(self):
        return [RELAYED]


def fake_host(peer, addrs=(), dialled=None):
    """A host holding only a relayed connection to ``peer``, knowing ``addrs`` of it; direct
    dials are recorded in ``dialled`` and fail."""
    async def dial_addr(addr, peer_id, source=None):
        dialled.append(str(addr))
        raise OSError("unreachable")

    net = types.SimpleNamespace(connections={peer: [FakeConn()]}, dial_addr=dial_addr)
    store = types.SimpleNamespace(addrs=lambda pid: list(addrs) if pid == peer else [])
    return types.SimpleNamespace(get_network=lambda: net, get_id=lambda: "me", get_peerstore=lambda: store)


def started_punches(cls, seconds: float) -> list:
    """Peers ``cls``'s self-driving loop started a hole punch towards within ``seconds``."""
    peer = "peer-behind-relay"
    svc = cls(fake_host(peer))
    calls = []

    async def record(peer_id):
        calls.append(peer_id)
        svc._hole_punch_attempts[peer_id] = svc._hole_punch_attempts.get(peer_id, 0) + 1
        return False

    svc.initiate_hole_punch = record

    async def main():
        with trio.move_on_after(seconds):
            await svc._auto_drive_loop()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))  # virtual seconds
    return calls


def test_upstream_dcutr_punches_relayed_peers_by_itself_with_a_budget_of_three():
    calls = started_punches(upstream.DCUtRProtocol, 9.0)  # the loop wakes every 2 s
    assert calls and set(calls) == {"peer-behind-relay"}
    assert len(calls) == upstream.MAX_HOLE_PUNCH_ATTEMPTS == 3


def test_the_wrapper_punches_only_when_asked():
    assert started_punches(PunchingDCUtR, 2.5) == []


def test_upstream_names_the_wrapper_relies_on():
    svc = upstream.DCUtRProtocol(fake_host("p"))
    for name in ("_hole_punch_attempts", "_direct_connections"):
        assert isinstance(getattr(svc, name), (dict, set)), name
    for name in ("initiate_hole_punch", "_verify_direct_connection", "_auto_drive_loop"):
        assert callable(getattr(svc, name)), name
    from libp2p.network.swarm import Swarm

    # simultaneous open needs fixed Noise roles: one side upgrades as responder
    assert callable(getattr(Swarm, "dial_addr_as_responder", None))


def test_upstream_dials_the_known_addresses_before_each_exchange_and_the_wrapper_does_not():
    known = ["/ip4/10.0.0.2/tcp/4001", "/ip4/192.0.2.7/tcp/4001"]
    for cls, expect in ((upstream.DCUtRProtocol, known), (PunchingDCUtR, [])):
        dialled: list[str] = []
        svc = cls(fake_host("p", known, dialled))
        assert trio.run(svc._try_unilateral_upgrade, "p") is False
        assert sorted(dialled) == sorted(expect), cls

    # upstream's attempt starts with that dial: a success there ends the attempt before any exchange
    svc = upstream.DCUtRProtocol(fake_host("p"))
    asked = []

    async def upgraded(peer_id):
        asked.append(peer_id)
        return True

    svc._try_unilateral_upgrade = upgraded
    assert trio.run(svc.initiate_hole_punch, "p") is True and asked == ["p"]
    assert "p" not in svc._hole_punch_attempts  # no exchange was started
