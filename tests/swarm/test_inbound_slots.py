"""A host's inbound connection cap counts live connections, not every connection ever made.

py-libp2p 0.8 gives each inbound connection a slot of ``max_connections - min_connections`` and
keeps it until the whole host stops (its handler waits for the swarm's end, not the
connection's): a stream of fresh peer ids that connect, say hello and leave used the slots up,
and every later connection was refused, an honest newcomer's included. :mod:`swarm.join_path`
gives the slot back when the connection closes.
"""

from __future__ import annotations

import trio

from swarm.host import HostConfig, open_host

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


def test_closed_connections_give_their_inbound_slot_back(tmp_path):
    # 60 connections at most, 50 kept for outbound: 10 inbound slots
    cfg = HostConfig(max_connections=60, identify_on_connect=False)
    client_cfg = HostConfig(identify_on_connect=False, dial_timeout_s=10.0)
    connected: list[int] = []

    async def main() -> None:
        async with open_host(tmp_path / "server", listen_addr=LOOPBACK, config=cfg) as server:
            for i in range(16):  # fresh ids, one after the other, each gone before the next
                async with open_host(tmp_path / f"c{i}", listen_addr=LOOPBACK, config=client_cfg) as client:
                    with trio.fail_after(20):
                        await client.connect(server.addrs[0])
                        while not server.libp2p_host.get_network().get_connections():  # the server kept it
                            await trio.sleep(0.05)
                    connected.append(i)
                with trio.fail_after(10):  # the server sees the connection end
                    while server.libp2p_host.get_network().get_connections():
                        await trio.sleep(0.05)

    trio.run(main)
    assert connected == list(range(16))
