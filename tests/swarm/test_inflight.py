"""The in-flight budget of incoming frame bodies (swarm/inflight.py) and its use by read_frame."""

from __future__ import annotations

import trio
import trio.testing

from swarm.inflight import InFlight, fits


def test_fits_lets_one_oversized_body_alone_through():
    assert fits(0, 10**12, 100)
    assert fits(40, 60, 100) and not fits(41, 60, 100)


def test_bodies_wait_for_room_globally_and_per_peer():
    log = []

    async def main():
        pool = InFlight(global_bytes=100, peer_bytes=60)

        async def take(peer, n, hold_s):
            await pool.acquire(peer, n)
            log.append((round(trio.current_time()), peer, n, pool.held))
            await trio.sleep(hold_s)
            pool.release(peer, n)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(take, "a", 50, 10)
            await trio.sleep(0.1)
            nursery.start_soon(take, "a", 20, 1)  # peer a: 50 + 20 > 60, waits for the first
            nursery.start_soon(take, "b", 40, 5)  # global 50 + 40 <= 100: at once
            await trio.sleep(0.1)
            nursery.start_soon(take, "c", 30, 1)  # global 90 + 30 > 100: waits for b
        assert pool.held == 0 and pool.by_peer == {}

        # a waiter cancelled holds nothing
        await pool.acquire("x", 100)
        with trio.move_on_after(1):
            await pool.acquire("y", 1)
        pool.release("x", 100)
        assert pool.held == 0

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert log == [(0, "a", 50, 50), (0, "b", 40, 90), (5, "c", 30, 80), (10, "a", 20, 20)]


def test_a_peers_slow_big_frames_hold_at_most_its_share(tmp_path):
    """Six streams of one peer each announce a 20 MiB frame and send it slowly: the server reads
    the bodies of at most 64 MiB of them at once; the others wait (and time out)."""
    import struct

    from swarm.host import HostConfig, open_host
    from swarm.inflight import PEER_BYTES, inflight
    from swarm.proto import protocol_id
    from swarm.wire import Message
    from dataclasses import dataclass

    @dataclass
    class Blob(Message):
        KIND = "blob"
        data: bytes

    async def echo(msg, peer):
        return msg

    seen = {}

    async def main():
        proto = protocol_id("test-inflight")
        async with open_host(tmp_path / "s", config=HostConfig(frame_timeout_s=4.0)) as server, \
                open_host(tmp_path / "c") as client:
            server.set_handler(proto, Blob, echo)
            peer = await client.connect(server.addrs[0])
            streams = []
            for _ in range(6):
                s = await client.open_stream(peer, proto)
                await s.write(struct.pack(">IB", 20 << 20, 0) + b"\x81\xa4data\xc6" + (20 << 20).to_bytes(4, "big"))
                streams.append(s)
            await trio.sleep(1.5)
            seen["held"], seen["peers"] = inflight().held, dict(inflight().by_peer)
            await trio.sleep(4.0)  # the frames never complete: their deadlines give the bytes back
            seen["after"] = inflight().held
            for s in streams:
                await s.reset()

    async def bounded():
        with trio.fail_after(30):
            await main()

    trio.run(bounded)
    assert seen["held"] == 3 * (20 << 20) <= PEER_BYTES, seen
    assert seen["after"] == 0, seen
