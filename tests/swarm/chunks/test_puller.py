"""The multi-peer puller and the chunk server over real py-libp2p hosts on 127.0.0.1 (one
process): several holders at once, a lying holder dropped and its chunks taken from others, a
stalled holder dropped after its request deadline, have-maps steering requests, the anchor asked
only for what no holder has, and giving up when nobody holds the content."""

from __future__ import annotations

import os
from contextlib import AsyncExitStack

import pytest
import trio

from swarm.chunks.manifest import chunk_hash, split_chunks
from swarm.chunks.choice import PullSettings
from swarm.chunks.pull import PullError, Puller
from swarm.chunks.serve import chunk_server
from swarm.chunks.store import MemoryChunks
from swarm.host import open_host
from swarm.proto.chunks import PeerRef
from test_chunk_store import Blob

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
CID = b"c" * 32
FAST = PullSettings(batch=2, request_timeout_s=5, dial_timeout_s=5, holder_refresh_s=0.2, empty_backoff_s=0.05,
                    give_up_s=20, probe_wait_s=5)


class Lying(MemoryChunks):
    """Claims every chunk and serves each with one byte flipped."""

    def read(self, i):
        data = super().read(i)
        return data if data is None else bytes([data[0] ^ 1]) + data[1:]


def content(n_chunks: int = 24, chunk: int = 4096):
    data = os.urandom(n_chunks * chunk - 100)
    chunks = split_chunks(data, chunk)
    return Blob(len(data), chunk, [chunk_hash(c) for c in chunks]), chunks


def record(server, log: list, delay: float = 0.0, stall: bool = False):
    """Wrap a chunk server: log every request's indices; answer ``delay`` late, or never."""
    real = server.on_chunks

    async def on_chunks(msg, peer):
        log.append(list(msg.indices))
        if stall and msg.indices:
            await trio.sleep_forever()
        await trio.sleep(delay)
        return await real(msg, peer)
    server.on_chunks = on_chunks


async def hosts(stack: AsyncExitStack, tmp_path, *names):
    return [await stack.enter_async_context(open_host(tmp_path / n, listen_addr=LOOPBACK)) for n in names]


def ref(h) -> PeerRef:
    return PeerRef(h.peer_id, list(h.addrs))


def run_trio(fn, seconds=60):
    async def bounded():
        with trio.fail_after(seconds):
            await fn()
    trio.run(bounded)


def test_pulls_from_several_holders_and_drops_a_liar(tmp_path):
    m, chunks = content()
    out = {}

    async def main():
        async with AsyncExitStack() as stack:
            a, b, liar, me = await hosts(stack, tmp_path, "a", "b", "liar", "me")
            for h in (a, b):
                chunk_server(h).add(CID, MemoryChunks(m, chunks))
                record(chunk_server(h), [], delay=0.02)  # slow enough that both get asked
            chunk_server(liar).add(CID, Lying(m, chunks))
            store = MemoryChunks(m)

            async def sources():
                return [ref(a), ref(b), ref(liar)]
            puller = Puller(me, store, CID, sources, settings=FAST)
            await puller.run()
            out.update(payload=store.payload(), puller=puller, a=a.peer_id, b=b.peer_id, liar=liar.peer_id)

    run_trio(main)
    p = out["puller"]
    assert out["payload"] == b"".join(chunks)
    assert out["liar"] in p.bad_peers and out["liar"] not in p.from_peers
    assert p.from_peers.get(out["a"], 0) > 0 and p.from_peers.get(out["b"], 0) > 0, p.from_peers
    assert sum(p.from_peers.values()) == m.total_bytes


def test_a_stalled_holder_is_dropped_and_its_chunks_come_from_another(tmp_path):
    m, chunks = content(12)
    out = {}

    async def main():
        async with AsyncExitStack() as stack:
            good, stalled, me = await hosts(stack, tmp_path, "good", "stalled", "me")
            chunk_server(good).add(CID, MemoryChunks(m, chunks))
            record(chunk_server(good), [], delay=0.05)
            chunk_server(stalled).add(CID, MemoryChunks(m, chunks))
            asked: list = []
            record(chunk_server(stalled), asked, stall=True)
            store = MemoryChunks(m)

            async def sources():
                return [ref(good), ref(stalled)]
            settings = PullSettings(batch=2, request_timeout_s=1.0, dial_timeout_s=5, holder_refresh_s=60,
                                    empty_backoff_s=0.05, max_failures=1, give_up_s=20)
            puller = Puller(me, store, CID, sources, settings=settings)
            t0 = trio.current_time()
            await puller.run()
            out.update(payload=store.payload(), puller=puller, stalled=stalled.peer_id, good=good.peer_id,
                       asked=asked, took=trio.current_time() - t0)

    run_trio(main)
    p = out["puller"]
    assert out["payload"] == b"".join(chunks)
    assert any(out["asked"]), "the stalled holder was never asked for chunks"
    assert out["stalled"] in p.dropped and out["stalled"] not in p.from_peers
    assert p.from_peers[out["good"]] == m.total_bytes  # including what the stalled one sat on
    assert out["took"] < 10


def test_have_maps_steer_requests_and_the_anchor_serves_only_what_no_holder_has(tmp_path):
    m, chunks = content(16)
    even = [c if i % 2 == 0 else None for i, c in enumerate(chunks)]
    out = {}

    async def main():
        async with AsyncExitStack() as stack:
            anchor, half, me = await hosts(stack, tmp_path, "anchor", "half", "me")
            await me.connect(anchor.addrs[0])
            chunk_server(anchor).add(CID, MemoryChunks(m, chunks))
            partial = MemoryChunks(m, even)
            chunk_server(half).add(CID, partial)
            to_anchor, to_half = [], []
            record(chunk_server(anchor), to_anchor)
            record(chunk_server(half), to_half)
            store = MemoryChunks(m)

            async def sources():
                return [ref(half)]
            puller = Puller(me, store, CID, sources, anchor=anchor.peer_id, anchor_last=True, settings=FAST)
            await puller.run()
            out.update(payload=store.payload(), puller=puller, to_anchor=to_anchor, to_half=to_half,
                       anchor=anchor.peer_id, half=half.peer_id)

    run_trio(main)
    assert out["payload"] == b"".join(chunks)
    asked_anchor = {i for r in out["to_anchor"] for i in r}
    asked_half = {i for r in out["to_half"] for i in r}
    assert asked_anchor and all(i % 2 for i in asked_anchor), out["to_anchor"]  # only what the holder lacks
    assert asked_half and all(i % 2 == 0 for i in asked_half), out["to_half"]  # only what its have-map names
    assert out["to_half"][0] == []  # the first request only fetches the have-map
    p = out["puller"]
    assert set(p.from_peers) == {out["anchor"], out["half"]}


def test_gives_up_when_nobody_holds_the_content(tmp_path):
    m, _ = content(4)

    async def main():
        async with AsyncExitStack() as stack:
            empty, me = await hosts(stack, tmp_path, "empty", "me")
            chunk_server(empty)  # serves, but not this content

            async def sources():
                return [ref(empty)]
            settings = PullSettings(request_timeout_s=2, dial_timeout_s=2, holder_refresh_s=0.2, empty_backoff_s=0.05,
                                    give_up_s=1.0)
            t0 = trio.current_time()
            with pytest.raises(PullError, match="no new chunk"):
                await Puller(me, MemoryChunks(m), CID, sources, settings=settings).run()
            assert trio.current_time() - t0 < 5

    run_trio(main)


class Withholding(MemoryChunks):
    """Its have-map names every chunk; it sends none."""

    def has(self, i):
        return 0 <= i < self.n

    def read(self, i):
        return None

    def have_bitmap(self):
        return bytes([0xFF]) * ((self.n + 7) // 8)


def test_a_holder_withholding_what_its_have_map_claims_is_dropped(tmp_path):
    m, chunks = content(8)
    out = {}

    async def main():
        async with AsyncExitStack() as stack:
            good, liar, me = await hosts(stack, tmp_path, "good", "liar", "me")
            chunk_server(good).add(CID, MemoryChunks(m, chunks))
            record(chunk_server(good), [], delay=0.3)  # slow: the liar is asked meanwhile
            chunk_server(liar).add(CID, Withholding(m))
            store = MemoryChunks(m)

            async def sources():
                return [ref(good), ref(liar)]
            puller = Puller(me, store, CID, sources, settings=FAST)
            await puller.run()
            out.update(payload=store.payload(), puller=puller, liar=liar.peer_id)

    run_trio(main)
    assert out["payload"] == b"".join(chunks)
    assert out["liar"] in out["puller"].dropped and out["liar"] not in out["puller"].from_peers


def test_an_idle_holder_makes_room_for_another_when_peers_are_capped(tmp_path):
    m, chunks = content(6)
    out = {}

    async def main():
        async with AsyncExitStack() as stack:
            empty, full, me = await hosts(stack, tmp_path, "empty", "full", "me")
            chunk_server(empty).add(CID, MemoryChunks(m))  # holds the content, no chunk of it yet
            chunk_server(full).add(CID, MemoryChunks(m, chunks))
            store = MemoryChunks(m)

            async def sources():
                return [ref(empty), ref(full)]
            settings = PullSettings(batch=2, request_timeout_s=5, dial_timeout_s=5, holder_refresh_s=0.2,
                                    empty_backoff_s=0.05, give_up_s=20, max_peers=1)
            puller = Puller(me, store, CID, sources, settings=settings)
            await puller.run()
            out.update(payload=store.payload(), puller=puller, full=full.peer_id)

    run_trio(main)
    assert out["payload"] == b"".join(chunks)
    assert set(out["puller"].from_peers) == {out["full"]}
