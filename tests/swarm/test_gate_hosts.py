"""Budgets before admission on real py-libp2p hosts (127.0.0.1): every incoming stream passes the
host's gate (swarm/gate.py) before its handler runs; a refused peer gets a clear error, the host
and its other peers carry on."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import trio

from swarm.chunks.serve import chunk_server
from swarm.errors import RemoteError
from swarm.framing import read_frame, write_frame
from swarm.host import HostConfig, open_host
from swarm.limits import LimitSettings
from swarm.pipeline.proto import PIPELINE, StageOpen
from swarm.pipeline.server import serve_stage
from swarm.proto import CHUNKS, HELLO, RUN_INFO, protocol_id
from swarm.proto.chunks import ChunkRequest
from swarm.proto.hello import Hello, HelloAck
from test_host import BIG, SLOW, Blob, _hello, on_big, on_hello, on_slow

DEADLINE_S = 40.0


def run(fn) -> None:
    async def main() -> None:
        with trio.fail_after(DEADLINE_S):
            await fn()

    trio.run(main)


def limited(**kw) -> HostConfig:
    return HostConfig(limits=LimitSettings(**kw))


async def serve(tmp_path: Path, config: HostConfig):
    host_cm = open_host(tmp_path / "server", config=config)
    server = await host_cm.__aenter__()
    server.set_handler(HELLO, Hello, on_hello)
    server.set_handler(SLOW, Hello, on_slow)
    server.set_handler(BIG, Blob, on_big)
    server.set_handler(RUN_INFO, Hello, on_hello)  # an open read, for the test
    return host_cm, server


async def hello(client, peer) -> HelloAck:
    return await client.request(peer, HELLO, _hello(), HelloAck, timeout=10)


def test_requests_per_minute_per_peer_then_a_clear_error(tmp_path: Path, caplog) -> None:
    async def body() -> None:
        cm, server = await serve(tmp_path, limited(requests_per_min_peer=5, log_interval_s=60))
        try:
            async with open_host(tmp_path / "a") as a, open_host(tmp_path / "b") as b:
                peer = await a.connect(server.addrs[0])
                await b.connect(server.addrs[0])
                for _ in range(5):
                    assert (await hello(a, peer)).accepted
                for _ in range(3):
                    with pytest.raises(RemoteError, match=r"rate limited: requests per minute of peer .* retry after"):
                        await hello(a, peer)
                assert (await hello(b, peer)).accepted  # another peer is not held back
                assert server.gate.refused == {"requests per minute": 3}
        finally:
            await cm.__aexit__(None, None, None)

    with caplog.at_level(logging.WARNING, logger="swarm.gate"):
        run(body)
    lines = [r for r in caplog.records if "refused" in r.getMessage() and "requests per minute" in r.getMessage()]
    assert len(lines) == 1  # three refusals, one line (rate-limited logging)


def test_open_reads_are_rate_limited_for_strangers(tmp_path: Path) -> None:
    async def body() -> None:
        cm, server = await serve(tmp_path, limited(open_reads_per_min_peer=3))
        try:
            async with open_host(tmp_path / "a") as a:
                peer = await a.connect(server.addrs[0])
                for _ in range(3):
                    await a.request(peer, RUN_INFO, _hello(), HelloAck, timeout=10)
                with pytest.raises(RemoteError, match="open reads per minute"):
                    await a.request(peer, RUN_INFO, _hello(), HelloAck, timeout=10)
                assert (await hello(a, peer)).accepted  # hello is not an open read
        finally:
            await cm.__aexit__(None, None, None)

    run(body)


def test_open_streams_per_connection_are_capped(tmp_path: Path) -> None:
    async def body() -> None:
        config = limited(streams_per_conn=2)
        config.handler_timeout_s = 2.0  # a stream's slot comes back when its handler ends
        cm, server = await serve(tmp_path, config)
        try:
            async with open_host(tmp_path / "a") as a:
                peer = await a.connect(server.addrs[0])
                async with trio.open_nursery() as nursery:
                    for _ in range(2):  # two slow requests hold both streams of the connection
                        nursery.start_soon(lambda: a.request(peer, SLOW, _hello(), HelloAck, timeout=5))
                    await trio.sleep(1.0)
                    with pytest.raises(RemoteError, match="open streams of conn"):
                        await hello(a, peer)
                    nursery.cancel_scope.cancel()
                await trio.sleep(2.5)  # the slow handlers timed out: their slots came back
                assert (await hello(a, peer)).accepted
                assert server.gate.limits.open["conn"] == {}
        finally:
            await cm.__aexit__(None, None, None)

    run(body)


def test_bytes_per_second_refuse_a_flood_mid_frame(tmp_path: Path) -> None:
    async def body() -> None:
        cm, server = await serve(tmp_path, limited(bytes_per_s_peer=1024, bytes_burst_peer=300_000))
        try:
            async with open_host(tmp_path / "a") as a:
                peer = await a.connect(server.addrs[0])
                blob = Blob(data=os.urandom(100_000))
                for _ in range(2):  # within the burst
                    await a.request(peer, BIG, blob, Blob, timeout=10)
                with pytest.raises(RemoteError, match="bytes per second of peer"):
                    for _ in range(3):
                        await a.request(peer, BIG, blob, Blob, timeout=10)
        finally:
            await cm.__aexit__(None, None, None)

    run(body)


def test_decoded_memory_is_charged_before_objects_are_built(tmp_path: Path) -> None:
    async def body() -> None:
        cm, server = await serve(tmp_path, limited(decoded_per_s_peer=1.0, decoded_burst_peer=1_000_000))
        try:
            async with open_host(tmp_path / "a") as a:
                peer = await a.connect(server.addrs[0])
                big = Blob(data=os.urandom(700_000))  # charged ~ its bytes once scanned
                await a.request(peer, BIG, big, Blob, timeout=10)
                with pytest.raises(RemoteError, match="decoded memory per second of peer"):
                    await a.request(peer, BIG, big, Blob, timeout=10)
        finally:
            await cm.__aexit__(None, None, None)

    run(body)


def test_one_address_block_shares_its_budget(tmp_path: Path) -> None:
    async def body() -> None:
        cm, server = await serve(tmp_path, limited(requests_per_min_block=4))
        try:
            async with open_host(tmp_path / "a") as a, open_host(tmp_path / "b") as b:
                peer = await a.connect(server.addrs[0])
                await b.connect(server.addrs[0])
                for client in (a, b, a, b):
                    assert (await hello(client, peer)).accepted
                for client in (a, b):  # fresh peer ids do not help: both are in 127.0.0.0/24
                    with pytest.raises(RemoteError, match=r"of block 127\.0\.0\.0/24"):
                        await hello(client, peer)
        finally:
            await cm.__aexit__(None, None, None)

    run(body)


def test_chunk_server_counts_every_request_frame(tmp_path: Path) -> None:
    async def body() -> None:
        async with open_host(tmp_path / "server", config=limited(open_reads_per_min_peer=4)) as server:
            chunk_server(server).add(b"c" * 32, _Chunks([os.urandom(1024) for _ in range(4)]))
            async with open_host(tmp_path / "a") as a:
                peer = await a.connect(server.addrs[0])
                stream = await a.open_stream(peer, CHUNKS)
                try:
                    for i in range(5):  # the stream with its first frame is one request
                        await write_frame(stream, ChunkRequest(b"c" * 32, [i % 4]).to_wire(), timeout=5)
                        reply = await read_frame(stream, timeout=5)
                        if i < 4:
                            assert reply["chunks"][0]["data"]
                    assert reply == {"ok": False, "error": reply["error"]}
                    assert "open reads per minute of peer" in reply["error"]
                finally:
                    await stream.reset()
    run(body)


class _Chunks:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def has(self, i: int) -> bool:
        return 0 <= i < len(self.chunks)

    def read(self, i: int) -> bytes | None:
        return self.chunks[i] if self.has(i) else None

    def have_bitmap(self) -> bytes:
        return b"\x0f"


class _Stage:
    start, end, n_layers, adapter_version, inline = 0, 1, 2, 0, True

    def open_session(self, session_id, req):
        pass

    def close_session(self, session_id):
        pass


def test_stage_server_refuses_past_the_peers_streams(tmp_path: Path) -> None:
    async def body() -> None:
        async with open_host(tmp_path / "stage", config=limited(streams_per_peer=2)) as stage:
            serve_stage(stage, _Stage())
            async with open_host(tmp_path / "head") as head:
                peer = await head.connect(stage.addrs[0])
                held = []
                for _ in range(2):
                    s = await head.open_stream(peer, PIPELINE)
                    await write_frame(s, StageOpen("s", 0, 1, 0, 1, 16).to_wire(), timeout=5)
                    assert (await read_frame(s, timeout=5))["ok"]
                    held.append(s)
                s = await head.open_stream(peer, PIPELINE)
                env = await read_frame(s, timeout=5)
                assert env["ok"] is False and "open streams of peer" in env["error"]
                for s in held:
                    await s.close()
    run(body)


def test_unknown_protocols_and_disabled_limits_still_work(tmp_path: Path) -> None:
    async def body() -> None:
        cm, server = await serve(tmp_path, limited(enabled=False, requests_per_min_peer=1))
        try:
            async with open_host(tmp_path / "a") as a:
                peer = await a.connect(server.addrs[0])
                for _ in range(5):
                    assert (await hello(a, peer)).accepted
                with pytest.raises(Exception):
                    await a.request(peer, protocol_id("nope"), _hello(), HelloAck, timeout=5)
        finally:
            await cm.__aexit__(None, None, None)

    run(body)


def _buffered(server, client_id: str) -> tuple[int, int]:
    """(bytes buffered unread, streams tracked) on the server's yamux connections from ``client_id``."""
    from libp2p.peer.id import ID

    conns = server.libp2p_host.get_network().get_connections(ID.from_base58(client_id))
    muxed = [c.muxed_conn for c in conns]
    return sum(len(b) for m in muxed for b in m.stream_buffers.values()), sum(len(m.streams) for m in muxed)


def test_a_refused_frames_unread_bytes_are_dropped_at_once(tmp_path: Path) -> None:
    """py-libp2p keeps a reset stream's unread bytes for a minute; refused frames must not."""
    import struct

    async def body() -> None:
        cm, server = await serve(tmp_path, HostConfig())
        try:
            async with open_host(tmp_path / "a") as a:
                peer = await a.connect(server.addrs[0])
                for _ in range(20):  # each announces 4 MiB on hello (budget ~1.1 MiB): refused unread
                    stream = await a.open_stream(peer, HELLO)
                    try:
                        with trio.move_on_after(2):
                            await stream.write(struct.pack(">IB", 4 << 20, 0) + os.urandom(200_000))
                            await stream.read(10)
                    except Exception:
                        pass
                await trio.sleep(1.0)
                held, streams = _buffered(server, a.peer_id)
                assert held == 0 and streams <= 1, (held, streams)
                assert (await hello(a, peer)).accepted
        finally:
            await cm.__aexit__(None, None, None)

    run(body)
