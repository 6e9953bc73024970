"""One peer of the circuit-relay v2 + DCUtR experiment (``test_holepunch.py``), on echo-swarm's
own libp2p host stack (Ed25519, Noise, Yamux): ``relay SECONDS`` | ``listener RELAY_ADDR
SECONDS`` | ``dialer RELAY_ADDR LISTENER_ID``. Prints ``ID``, then JSON result lines."""

from __future__ import annotations

import json
import sys
import tempfile

import multiaddr
import trio

PORT = 8000


def conn_addrs(host, pid) -> list[list[str]]:
    out = []
    for c in host.get_network().connections.get(pid, []) or []:
        try:
            out.append([str(a) for a in c.get_transport_addresses()])
        except Exception as e:
            out.append([repr(e)])
    return out


async def main(role: str, args: list[str]) -> None:
    from libp2p.peer.id import ID
    from libp2p.peer.peerinfo import info_from_p2p_addr
    from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
    from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
    from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID, STOP_PROTOCOL_ID, CircuitV2Protocol
    from libp2p.relay.circuit_v2.resources import RelayLimits
    from libp2p.relay.circuit_v2.transport import CircuitV2Transport
    from libp2p.tools.anyio_service import background_trio_service

    from swarm.host import _build_libp2p_host, load_or_create_identity

    listen = multiaddr.Multiaddr(f"/ip4/0.0.0.0/tcp/{PORT}")
    host = _build_libp2p_host(load_or_create_identity(tempfile.mkdtemp()), listen)
    limits = RelayLimits(duration=600, data=64 << 20, max_circuit_conns=8, max_reservations=8)
    roles = RelayRole.STOP | RelayRole.CLIENT | (RelayRole.HOP if role == "relay" else RelayRole(0))
    proto = CircuitV2Protocol(host, limits=limits, allow_hop=role == "relay")
    dcutr = DCUtRProtocol(host)
    async with host.run([listen]):
        host.set_stream_handler(PROTOCOL_ID, proto._handle_hop_stream)
        host.set_stream_handler(STOP_PROTOCOL_ID, proto._handle_stop_stream)
        async with background_trio_service(proto), background_trio_service(dcutr):
            transport = CircuitV2Transport(host, proto, RelayConfig(roles=roles, limits=limits))
            print("ID", host.get_id(), flush=True)
            if role == "relay":
                await trio.sleep(float(args[0]))
                return
            relay = info_from_p2p_addr(multiaddr.Multiaddr(args[0]))
            with trio.fail_after(20):
                await host.connect(relay)
            if role == "listener":
                async with trio.open_nursery() as nursery:
                    with trio.fail_after(20):
                        stream = await host.new_stream(relay.peer_id, [PROTOCOL_ID])
                        ok = await transport.reserve(stream, relay.peer_id, nursery)
                    print(json.dumps({"reserved": ok}), flush=True)
                    await trio.sleep(float(args[1]))
                    nursery.cancel_scope.cancel()
                return
            target = ID.from_base58(args[1])
            with trio.fail_after(30):
                await transport.dial(multiaddr.Multiaddr(f"{args[0]}/p2p-circuit/p2p/{target}"))
            relayed = conn_addrs(host, target)
            with trio.move_on_after(40):
                punched = await dcutr.initiate_hole_punch(target)
            with trio.move_on_after(30):  # a direct connection may come a little later (from either side)
                while all(any("/p2p-circuit/" in a for a in c) for c in conn_addrs(host, target)):
                    await trio.sleep(0.5)
            print(json.dumps({"relayed": relayed, "hole_punch": punched, "after": conn_addrs(host, target)}),
                  flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2:])
