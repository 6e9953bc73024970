"""SwarmHost over real py-libp2p hosts on 127.0.0.1 (TCP + Noise + Yamux)."""

from __future__ import annotations

import logging
import os
import random
import stat
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from swarm.errors import FrameError, FrameTooLarge, PeerUnreachable, RemoteError, SwarmTimeout
from swarm.framing import encode_frame
from swarm.host import IDENTITY_FILE, HostConfig, SwarmHost, open_host
from swarm.proto import HELLO, protocol_id
from swarm.proto.hello import Hello, HelloAck
from swarm.wire import Message

#: Every test body runs under this deadline.
TEST_DEADLINE_S = 20.0
#: How long a misbehaving raw stream may take to be reset by the server.
RESET_WITHIN_S = 3.0
SLOW = protocol_id("test-slow")
BOOM = protocol_id("test-boom")
BIG = protocol_id("test-big")


def _hello() -> Hello:
    return Hello(backend="llamacpp", device="cpu (2 cores)", memory_bytes=8 << 30, tokens_per_s=150.0)


async def on_hello(msg: Hello, peer_id: str) -> HelloAck:
    return HelloAck(accepted=True, run_id=f"run-{peer_id[-6:]}", model=msg.backend, current_version=3)


async def on_slow(msg: Hello, peer_id: str) -> HelloAck:
    await trio.sleep(30)
    return await on_hello(msg, peer_id)


async def on_boom(msg: Hello, peer_id: str) -> HelloAck:
    raise RuntimeError("kaboom")


@dataclass
class Blob(Message):
    KIND = "blob"
    data: bytes


async def on_big(msg: Blob, peer_id: str) -> Blob:
    """Echo the data followed by as many fresh random (incompressible) bytes."""
    return Blob(data=msg.data + os.urandom(len(msg.data)))


def run(fn: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        with trio.fail_after(TEST_DEADLINE_S):
            await fn()

    trio.run(main)


@asynccontextmanager
async def pair(tmp_path: Path, server_config: HostConfig | None = None) -> AsyncIterator[tuple[SwarmHost, SwarmHost, str]]:
    """(client, server, server peer id), connected, with the test handlers registered."""
    async with open_host(tmp_path / "server", config=server_config) as server:
        server.set_handler(HELLO, Hello, on_hello)
        server.set_handler(SLOW, Hello, on_slow)
        server.set_handler(BOOM, Hello, on_boom)
        server.set_handler(BIG, Blob, on_big)
        async with open_host(tmp_path / "client") as client:
            peer = await client.connect(server.addrs[0])
            assert peer == server.peer_id
            yield client, server, peer


async def raw_stream(client: SwarmHost, peer: str, proto: str = HELLO):
    from libp2p.custom_types import TProtocol
    from libp2p.peer.id import ID

    return await client.libp2p_host.new_stream(ID.from_base58(peer), [TProtocol(proto)])


async def assert_server_drops(stream) -> None:
    """The server resets/closes the stream without sending a frame."""
    with trio.fail_after(RESET_WITHIN_S):
        try:
            data = await stream.read(100)
        except Exception:  # StreamReset / StreamEOF
            return
        assert data == b""


async def assert_hello_works(client: SwarmHost, peer: str) -> None:
    ack = await client.request(peer, HELLO, _hello(), HelloAck, timeout=5)
    assert ack.accepted and ack.current_version == 3 and ack.run_id == f"run-{client.peer_id[-6:]}"


# ---------------------------------------------------------------------------- basics


def test_request_response_round_trip(tmp_path: Path) -> None:
    async def body() -> None:
        async with pair(tmp_path) as (client, server, peer):
            assert all(a.endswith(f"/p2p/{server.peer_id}") and "/tcp/" in a for a in server.addrs)
            for _ in range(3):
                await assert_hello_works(client, peer)

    run(body)


def test_large_message_is_compressed_in_transit(tmp_path: Path) -> None:
    async def body() -> None:
        async with pair(tmp_path) as (client, _server, peer):
            # compressible like real payloads (about 2x), not a bomb: inflating more than 256x past
            # the first MiB is refused (swarm/framing.py)
            data = random.Random(0).randbytes(1_628_000).hex().encode()
            reply = await client.request(peer, BIG, Blob(data=data), Blob, timeout=10)
            assert reply.data[: len(data)] == data and len(reply.data) == 2 * len(data)

    run(body)


def test_identity_persists_across_restarts(tmp_path: Path) -> None:
    async def body() -> None:
        async with open_host(tmp_path / "node") as host:
            first = host.peer_id
        key = tmp_path / "node" / IDENTITY_FILE
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        async with open_host(tmp_path / "node") as host:
            assert host.peer_id == first
        async with open_host(tmp_path / "other") as host:
            assert host.peer_id != first
        key.chmod(0o644)  # too open: tightened on the next start
        async with open_host(tmp_path / "node") as host:
            assert host.peer_id == first
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / IDENTITY_FILE).write_bytes(b"not a key")
        with pytest.raises(ValueError, match="not a libp2p private key"):
            async with open_host(tmp_path / "bad"):
                pass

    run(body)


def test_rejects_bad_listen_address_and_config(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        HostConfig(request_timeout_s=0)

    async def body() -> None:
        with pytest.raises(ValueError):
            async with open_host(tmp_path / "n", listen_addr="/ip4/127.0.0.1/udp/0/quic-v1"):
                pass

    run(body)


def test_redial_after_peer_restart(tmp_path: Path) -> None:
    async def body() -> None:
        async with open_host(tmp_path / "client") as client:
            async with open_host(tmp_path / "server") as server:
                server.set_handler(HELLO, Hello, on_hello)
                addr = server.addrs[0]
                peer = await client.connect(addr)
                await assert_hello_works(client, peer)
            listen = addr.split("/p2p/")[0]
            # Forget the peerstore's copy of the address (as when its TTL runs out): only
            # SwarmHost's own re-dial, from the address given to connect(), can reach it.
            from libp2p.peer.id import ID

            client.libp2p_host.get_peerstore().clear_addrs(ID.from_base58(peer))
            async with open_host(tmp_path / "server", listen_addr=listen) as server:
                server.set_handler(HELLO, Hello, on_hello)
                assert server.peer_id == peer
                async with trio.open_nursery() as nursery:  # concurrent requests all re-dial
                    for _ in range(5):
                        nursery.start_soon(assert_hello_works, client, peer)

    run(body)


def test_a_closed_connection_left_listed_does_not_block_requests(tmp_path: Path) -> None:
    """py-libp2p may keep a connection whose close began elsewhere in its list; its host.connect then
    returns at once and every stream fails with 'no valid connections' unless the host drops it."""
    async def body() -> None:
        async with pair(tmp_path) as (client, _server, peer):
            from libp2p.peer.id import ID

            network = client.libp2p_host.get_network()
            conns = network.get_connections(ID.from_base58(peer))
            assert conns
            for conn in conns:
                conn.event_closed.set()  # closed, yet still listed, as after a close begun elsewhere
            assert network.get_connections(ID.from_base58(peer))
            for _ in range(3):
                await assert_hello_works(client, peer)
            assert all(not c.is_closed for c in network.get_connections(ID.from_base58(peer)))

    run(body)


def test_unreachable_and_unsupported(tmp_path: Path) -> None:
    async def body() -> None:
        async with open_host(tmp_path / "ghost") as ghost:
            ghost_id = ghost.peer_id
        async with pair(tmp_path) as (client, _server, peer):
            with pytest.raises(PeerUnreachable):
                await client.request(peer, protocol_id("nobody-serves-this"), _hello(), HelloAck, timeout=5)
            with pytest.raises(PeerUnreachable):
                await client.connect("/ip4/127.0.0.1/tcp/1/p2p/" + ghost_id)
            with pytest.raises(PeerUnreachable):
                await client.request(ghost_id, HELLO, _hello(), HelloAck, timeout=5)
            with pytest.raises(PeerUnreachable):
                await client.request("not-a-peer-id", HELLO, _hello(), HelloAck, timeout=5)
            await assert_hello_works(client, peer)

    run(body)


# ---------------------------------------------------------------------------- handler failures


def test_handler_exception_is_a_remote_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        async with pair(tmp_path) as (client, _server, peer):
            with caplog.at_level(logging.WARNING, logger="swarm.host"):
                with pytest.raises(RemoteError, match="kaboom"):
                    await client.request(peer, BOOM, _hello(), HelloAck, timeout=5)
            assert any(client.peer_id in r.getMessage() for r in caplog.records)
            await assert_hello_works(client, peer)

    run(body)


def test_invalid_request_is_a_remote_error(tmp_path: Path) -> None:
    async def body() -> None:
        async with pair(tmp_path) as (client, _server, peer):
            with pytest.raises(RemoteError, match="invalid request"):
                await client.request(peer, HELLO, Blob(data=b"not a hello"), HelloAck, timeout=5)
            await assert_hello_works(client, peer)

    run(body)


def test_handler_timeout(tmp_path: Path) -> None:
    async def body() -> None:
        async with pair(tmp_path, HostConfig(handler_timeout_s=0.3)) as (client, _server, peer):
            t0 = trio.current_time()
            with pytest.raises(RemoteError, match="timed out"):
                await client.request(peer, SLOW, _hello(), HelloAck, timeout=5)
            assert trio.current_time() - t0 < 3
            await assert_hello_works(client, peer)

    run(body)


def test_a_handler_may_have_its_own_deadline(tmp_path: Path) -> None:
    """A handler registered with ``timeout_s`` (the learner's rollout push, the largest request
    a node sends) outlives the host's default deadline; others keep it."""
    async def medium(msg: Hello, peer_id: str) -> HelloAck:
        await trio.sleep(0.8)
        return await on_hello(msg, peer_id)

    async def body() -> None:
        async with pair(tmp_path, HostConfig(handler_timeout_s=0.3)) as (client, server, peer):
            server.set_handler("/echo-swarm/test-long/1.0.0", Hello, medium, timeout_s=5.0)
            server.set_handler("/echo-swarm/test-short/1.0.0", Hello, medium)
            ack = await client.request(peer, "/echo-swarm/test-long/1.0.0", _hello(), HelloAck, timeout=5)
            assert ack.accepted
            with pytest.raises(RemoteError, match="timed out after 0.3"):
                await client.request(peer, "/echo-swarm/test-short/1.0.0", _hello(), HelloAck, timeout=5)

    run(body)


def test_client_request_timeout(tmp_path: Path) -> None:
    async def body() -> None:
        async with pair(tmp_path) as (client, _server, peer):
            with pytest.raises(SwarmTimeout) as info:
                await client.request(peer, SLOW, _hello(), HelloAck, timeout=0.3)
            assert isinstance(info.value, trio.TooSlowError)
            await assert_hello_works(client, peer)

    run(body)


def test_reply_above_the_cap(tmp_path: Path) -> None:
    async def body() -> None:
        cap = HostConfig(max_frame_bytes=200_000)
        async with pair(tmp_path, cap) as (client, _server, peer):
            # the server's reply (2x the request, random) would exceed its own cap: error envelope
            with pytest.raises(RemoteError, match="not sendable"):
                await client.request(peer, BIG, Blob(data=os.urandom(120_000)), Blob, timeout=5)
            # a request above the server's cap: the server resets the stream unread
            with pytest.raises(FrameError):
                await client.request(peer, BIG, Blob(data=os.urandom(250_000)), Blob, timeout=5)
            await assert_hello_works(client, peer)

    run(body)


# ---------------------------------------------------------------------------- hostile raw streams


def test_garbage_bytes_reset_the_stream_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        async with pair(tmp_path) as (client, _server, peer):
            with caplog.at_level(logging.WARNING, logger="swarm.host"):
                stream = await raw_stream(client, peer)
                await stream.write(b"\x00\x00\x00\x08\x00" + b"\xc1garbage")
                await assert_server_drops(stream)
            assert any(client.peer_id in r.getMessage() for r in caplog.records)
            await assert_hello_works(client, peer)

    run(body)


def test_unknown_flags_reset_the_stream(tmp_path: Path) -> None:
    async def body() -> None:
        async with pair(tmp_path) as (client, _server, peer):
            stream = await raw_stream(client, peer)
            await stream.write(struct.pack(">IB", 1, 0x40) + b"\xc0")
            await assert_server_drops(stream)
            await assert_hello_works(client, peer)

    run(body)


def test_oversized_length_resets_the_stream_without_waiting_for_the_body(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        async with pair(tmp_path, HostConfig(max_frame_bytes=1 << 20)) as (client, _server, peer):
            with caplog.at_level(logging.WARNING, logger="swarm.host"):
                stream = await raw_stream(client, peer)
                await stream.write(struct.pack(">IB", 2**32 - 1, 0))  # announces 4 GiB, sends nothing
                await assert_server_drops(stream)  # well before frame_timeout_s
            assert any("FrameTooLarge" in r.getMessage() for r in caplog.records)
            await assert_hello_works(client, peer)

    run(body)


def test_truncated_frame_resets_the_stream(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        async with pair(tmp_path) as (client, _server, peer):
            frame = encode_frame(_hello().to_wire())
            with caplog.at_level(logging.WARNING, logger="swarm.host"):
                stream = await raw_stream(client, peer)
                await stream.write(frame[: len(frame) // 2])
                await stream.close()
                with trio.fail_after(RESET_WITHIN_S):
                    while not any("TruncatedFrame" in r.getMessage() for r in caplog.records):
                        await trio.sleep(0.02)
            await assert_hello_works(client, peer)

    run(body)


def test_silent_peer_is_timed_out(tmp_path: Path) -> None:
    async def body() -> None:
        async with pair(tmp_path, HostConfig(frame_timeout_s=0.3)) as (client, _server, peer):
            stream = await raw_stream(client, peer)
            await stream.write(b"\x00\x00")  # half a header, then silence
            await assert_server_drops(stream)
            await assert_hello_works(client, peer)

    run(body)


def test_many_concurrent_requests_with_hostile_streams_interleaved(tmp_path: Path) -> None:
    async def body() -> None:
        async with pair(tmp_path) as (client, _server, peer):

            async def hostile() -> None:
                stream = await raw_stream(client, peer)
                await stream.write(b"\xff" * 64)
                await assert_server_drops(stream)

            async with trio.open_nursery() as nursery:
                for i in range(10):
                    nursery.start_soon(assert_hello_works, client, peer)
                    if i % 3 == 0:
                        nursery.start_soon(hostile)

    run(body)


def test_frame_too_large_from_client_side_cap(tmp_path: Path) -> None:
    async def body() -> None:
        async with pair(tmp_path) as (client, _server, peer):
            client.config.max_frame_bytes = 1000
            with pytest.raises(FrameTooLarge):
                await client.request(peer, BIG, Blob(data=os.urandom(3000)), Blob, timeout=5)

    run(body)
