"""Pins the py-libp2p DCUtR behaviour that ``swarm.nat.dcutr.PunchingDCUtR`` overrides. When a
py-libp2p release changes it, a test here fails: then read ``swarm/nat/dcutr.py`` and see
whether the wrapper is still needed (or still right).

Upstream (0.8.1): every DCUtR service starts hole punches by itself, towards each peer it holds
only a relayed connection to, every 2 s, and stops after 3 attempts per peer; the wrapper
turns that off and gives each explicit attempt its own budget."""

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


def fake_host(peer):
    net = types.SimpleNamespace(connections={peer: [FakeConn()]})
    return types.SimpleNamespace(get_network=lambda: net, get_id=lambda: "me")


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
