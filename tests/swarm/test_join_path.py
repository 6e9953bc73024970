"""The join path under many simultaneous joins (swarm/join_path.py): limits and deadlines reach
py-libp2p, inbound handshakes are paced, identify on connect can be left out, and a failed join
tells a busy peer from an absent one. Real hosts on 127.0.0.1."""

from __future__ import annotations

import random
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio

from swarm.errors import PeerUnreachable, SwarmTimeout
from swarm.host import HostConfig, open_host
from swarm.join_path import is_alive_failure, pace_inbound_handshakes, retry_delay_s
from swarm.proto import HELLO
from swarm.proto.hello import Hello, HelloAck

DEADLINE_S = 40.0


async def on_hello(msg: Hello, peer_id: str) -> HelloAck:
    return HelloAck(accepted=True, run_id="r", model="m", current_version=0)


def hello() -> Hello:
    return Hello(backend="fake", device="sim", memory_bytes=1, tokens_per_s=1.0)


def run(fn) -> None:
    async def main() -> None:
        with trio.fail_after(DEADLINE_S):
            await fn()

    trio.run(main)


def test_retry_delay_is_full_jitter_exponential_and_capped():
    assert retry_delay_s(0, 0.0) == 0.0
    assert retry_delay_s(0, 0.999) == pytest.approx(0.4995)
    assert retry_delay_s(3, 0.5) == pytest.approx(2.0)  # 0.5 * 2**3 * 0.5
    assert max(retry_delay_s(a, 0.999999) for a in range(200)) < 10.0  # capped, no overflow
    rng = random.Random(0)
    spread = {round(retry_delay_s(4, rng.random()), 3) for _ in range(50)}
    assert len(spread) > 40  # peers that failed together come back at different times
    for bad in ((-1, 0.5), (0, 1.0), (0, -0.1)):
        with pytest.raises(ValueError):
            retry_delay_s(*bad)


def test_a_timeout_is_a_busy_peer():
    assert is_alive_failure(SwarmTimeout("dialling x took over 10 s"))
    broken = PeerUnreachable("cannot dial x: SwarmDialAllFailedError: no addresses ...")
    broken.__cause__ = RuntimeError("Error 1: failed to upgrade security for peer x")
    assert is_alive_failure(broken)
    assert not is_alive_failure(PeerUnreachable("bad peer address '/ip4/1.2.3.4': ..."))


def test_limits_and_deadlines_reach_libp2p_and_a_refused_dial_is_an_absent_peer(tmp_path: Path):
    async def body():
        cfg = HostConfig(max_connections=700, negotiate_timeout_s=45.0, dial_timeout_s=3.0)
        async with open_host(tmp_path / "a", config=cfg) as a:
            cc = a.libp2p_host.get_network().connection_config
            assert (cc.max_connections, cc.high_watermark, cc.low_watermark) == (700, 630, 100)
            assert cc.inbound_upgrade_timeout == cc.outbound_stream_protocol_negotiation_timeout == 45.0
            assert cc.dial_timeout == 3.0 and a.libp2p_host.negotiate_timeout == 45
            gone = a.addrs[0]
        async with open_host(tmp_path / "b", config=HostConfig(dial_timeout_s=5.0)) as b:
            with pytest.raises(PeerUnreachable) as err:
                await b.connect(gone)  # nothing listens there any more: connection refused
            assert not is_alive_failure(err.value)

    run(body)


def test_inbound_handshakes_are_paced_and_all_complete(tmp_path: Path):
    """Twelve peers dial at once a server that upgrades at most two connections at a time: never
    more than two run together, and every peer joins and is served."""
    async def body():
        async with open_host(tmp_path / "server", config=HostConfig(max_concurrent_handshakes=0)) as server:
            server.set_handler(HELLO, Hello, on_hello)
            network = server.libp2p_host.get_network()
            upgrade, running, peak = network.upgrade_inbound_raw_conn, [0], [0]

            async def counted(raw_conn, maddr):
                running[0] += 1
                peak[0] = max(peak[0], running[0])
                try:
                    await trio.sleep(0.05)  # a slow handshake: overlaps would show
                    return await upgrade(raw_conn, maddr)
                finally:
                    running[0] -= 1

            network.upgrade_inbound_raw_conn = counted
            limiter = pace_inbound_handshakes(server.libp2p_host, 2)
            assert limiter is not None and pace_inbound_handshakes(server.libp2p_host, 0) is None
            acks = []
            async with AsyncExitStack() as stack:
                clients = [await stack.enter_async_context(open_host(tmp_path / f"c{i}")) for i in range(12)]

                async def join(c):
                    await c.connect(server.addrs[0])
                    acks.append(await c.request(server.peer_id, HELLO, hello(), HelloAck, timeout=20))

                async with trio.open_nursery() as n:
                    for c in clients:
                        n.start_soon(join, c)
            assert len(acks) == 12 and all(a.accepted for a in acks)
            assert peak[0] == 2

    run(body)


def test_identify_on_connect_can_be_left_out(tmp_path: Path):
    async def body():
        async with open_host(tmp_path / "server") as server, \
                open_host(tmp_path / "quiet", config=HostConfig(identify_on_connect=False)) as quiet:
            server.set_handler(HELLO, Hello, on_hello)
            await quiet.connect(server.addrs[0])
            assert (await quiet.request(server.peer_id, HELLO, hello(), HelloAck)).accepted
            with trio.move_on_after(10):  # the server still identifies the quiet host (its default)
                while not server.libp2p_host._identified_peers:
                    await trio.sleep(0.05)
            assert server.libp2p_host._identified_peers and not quiet.libp2p_host._identified_peers

    run(body)
