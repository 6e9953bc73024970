"""Fetching a model's chunks from several peers at once.

One worker per peer (the learner and every holder it names): each asks its peer for the
next chunks that are missing, not already asked of another peer and held by that peer (as
its last reply's bitmap said), checks every chunk against the signed manifest and writes it
to disk. A peer that sends a bad chunk is never asked again and the chunk goes back to the
pool, so another peer supplies it; a peer that fails ``max_failures`` requests in a row is
dropped until the next holder refresh. Holders are refreshed every ``holder_refresh_s``
(nodes still fetching become holders of what they have), and the caller's ``report`` hook
runs at the same pace, so this node becomes a holder too.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import trio

from swarm.content.serve import close_stream
from swarm.content.store import ModelCopy, from_bitmap
from swarm.errors import EndOfStream, FrameError, SwarmError
from swarm.framing import read_frame, write_frame
from swarm.proto import MODEL_CHUNKS
from swarm.proto.dissem import PeerRef
from swarm.proto.model import ModelChunkReply, ModelChunkRequest
from swarm.wire import WireError

log = logging.getLogger(__name__)


@dataclass
class FetchSettings:
    #: Most chunks asked for in one request. Each peer's batch adapts to its measured rate so
    #: that one request takes about ``target_request_s`` (slow links: small requests, so one
    #: slow reply never holds many chunks hostage and never runs into the timeout).
    batch: int = 8
    #: Aimed-for duration (s) of one request.
    target_request_s: float = 3.0
    #: Deadline (s) of one chunk request.
    request_timeout_s: float = 30.0
    #: How often (s) holders are asked for again and progress is reported.
    holder_refresh_s: float = 2.0
    #: Pause (s) before asking a peer again that had nothing this node needs.
    empty_backoff_s: float = 0.5
    #: Failed requests in a row after which a peer is dropped (until the next refresh).
    max_failures: int = 3
    #: Give up after this long (s) without a new chunk.
    give_up_s: float = 120.0


class FetchError(Exception):
    """The model could not be fetched (no peer had the missing chunks for ``give_up_s``)."""


def next_batch(rate_bps: float, chunk_bytes: int, target_s: float, most: int) -> int:
    """Chunks to ask for next from a peer that delivered ``rate_bps`` (bytes/s) so far:
    about ``target_s`` worth, at least 1 and at most ``most``."""
    if rate_bps <= 0:
        return 1
    return max(1, min(most, int(rate_bps * target_s / max(1, chunk_bytes))))


def pick_chunks(missing: list[int], in_flight: set[int], peer_has: set[int] | None, batch: int,
                start: int = 0) -> list[int]:
    """The next chunks to ask one peer for: missing ones not asked of anyone else and held by
    the peer (``None``: it holds everything), scanning from ``start`` (wrapping around), so
    fetchers that start at different offsets soon hold different chunks to trade."""
    if batch < 1:
        return []
    pivot = next((k for k, i in enumerate(missing) if i >= start), len(missing))
    out = []
    for i in missing[pivot:] + missing[:pivot]:
        if i in in_flight or (peer_has is not None and i not in peer_has):
            continue
        out.append(i)
        if len(out) == batch:
            break
    return out


Progress = Callable[[int, int, float, int], None]


@dataclass
class ModelFetcher:
    host: object
    copy: ModelCopy
    learner_peer: str
    #: Returns the current holders (asks the learner).
    holders: Callable[[], Awaitable[list[PeerRef]]]
    settings: FetchSettings = field(default_factory=FetchSettings)
    #: ``progress(bytes_done, total_bytes, bytes_per_s, active_peers)`` after each chunk batch.
    progress: Progress | None = None
    #: Called every refresh with this fetcher (the node reports itself as a holder).
    report: Callable[["ModelFetcher"], Awaitable[None]] | None = None
    #: Bytes received per peer.
    from_peers: dict[str, int] = field(default_factory=dict)
    bad_peers: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._in_flight: set[int] = set()
        self._workers: set[str] = set()
        self._progress_event = trio.Event()
        self._start = random.randrange(max(1, self.copy.n))
        self._t0 = time.monotonic()
        self._bytes0 = self.copy.count() * self.copy.manifest.chunk_bytes
        self.fetch_s = 0.0

    def done_bytes(self) -> int:
        m = self.copy.manifest
        last = m.total_bytes - (self.copy.n - 1) * m.chunk_bytes
        held = self.copy.count()
        return min(m.total_bytes, held * m.chunk_bytes - (m.chunk_bytes - last if self.copy.has(self.copy.n - 1) else 0))

    async def run(self) -> None:
        """Fetch every missing chunk; raises :class:`FetchError` when stuck for ``give_up_s``."""
        if not self.copy.missing():
            return
        s = self.settings
        first = await self._holder_refs()
        # Dial the holders known now before any worker starts, so the learner (dialled
        # already) does not serve the whole model while the peers' dials are under way:
        # its upload is shared by the whole swarm.
        async with trio.open_nursery() as dials:
            for ref in first:
                dials.start_soon(self._try_dial, ref)
        async with trio.open_nursery() as nursery:
            for ref in first:
                self._spawn(nursery, ref)
            nursery.start_soon(self._refresh_loop, nursery)
            last = trio.current_time()
            while self.copy.missing():
                with trio.move_on_after(max(0.0, last + s.give_up_s - trio.current_time())) as scope:
                    await self._progress_event.wait()
                if scope.cancelled_caught:
                    raise FetchError(f"no new chunk for {s.give_up_s:.0f} s; {len(self.copy.missing())} of "
                                     f"{self.copy.n} chunks missing (peers tried: {len(self.from_peers)})")
                last = trio.current_time()
            self.fetch_s = time.monotonic() - self._t0
            nursery.cancel_scope.cancel()
        await self._report()

    async def _report(self) -> None:
        if self.report is None:
            return
        try:
            with trio.fail_after(self.settings.request_timeout_s):
                await self.report(self)
        except (SwarmError, WireError, trio.TooSlowError) as e:
            log.info("progress report failed: %s", e)

    def _poke(self) -> None:
        self._progress_event.set()
        self._progress_event = trio.Event()

    async def _refresh_loop(self, nursery: trio.Nursery) -> None:
        s = self.settings
        while True:
            self._spawn(nursery, PeerRef(self.learner_peer, []))  # again if its worker gave up
            if self.copy.count():
                await self._report()
            for ref in await self._holder_refs():
                self._spawn(nursery, ref)
            await trio.sleep(s.holder_refresh_s)

    async def _holder_refs(self) -> list[PeerRef]:
        """The current holders (other than this node), or none when the learner cannot say."""
        me = getattr(self.host, "peer_id", "")
        try:
            with trio.fail_after(self.settings.request_timeout_s):
                refs = await self.holders()
        except (SwarmError, WireError, trio.TooSlowError) as e:
            log.info("holder refresh failed: %s", e)
            return []
        return [r for r in refs if r.peer_id != me and r.peer_id not in self.bad_peers]

    async def _try_dial(self, ref: PeerRef) -> None:
        if ref.peer_id == self.learner_peer:
            return
        try:
            with trio.move_on_after(self.settings.request_timeout_s):
                await self._dial(ref)
        except SwarmError as e:
            log.info("model holder %s unreachable: %s", ref.peer_id[-8:], e)

    def _spawn(self, nursery: trio.Nursery, ref: PeerRef) -> None:
        me = getattr(self.host, "peer_id", "")
        if ref.peer_id in self._workers or ref.peer_id in self.bad_peers or ref.peer_id == me:
            return
        self._workers.add(ref.peer_id)
        nursery.start_soon(self._worker, ref)

    async def _dial(self, ref: PeerRef) -> None:
        last: Exception | None = None
        for addr in ref.addrs:
            try:
                await self.host.connect(addr)
                return
            except SwarmError as e:
                last = e
        if last is not None:
            raise last

    async def _ask(self, stream, want: list[int]) -> ModelChunkReply:
        s, cap = self.settings, self.host.config.max_frame_bytes
        req = ModelChunkRequest(self.copy.manifest.content_sha256, want)
        await write_frame(stream, req.to_wire(), timeout=s.request_timeout_s, max_size=cap)
        try:
            raw = await read_frame(stream, max_size=cap, timeout=s.request_timeout_s)
        except EndOfStream as e:
            raise FrameError("the peer closed the chunk stream") from e
        return ModelChunkReply.from_wire(raw)

    async def _worker(self, ref: PeerRef) -> None:
        s, peer = self.settings, ref.peer_id
        m = self.copy.manifest
        peer_has: set[int] | None = None if peer == self.learner_peer else set()
        failures = 0
        stream = None
        batch = 1
        try:
            if peer != self.learner_peer:
                await self._dial(ref)
            while self.copy.missing():
                want = pick_chunks(self.copy.missing(), self._in_flight, peer_has, batch, self._start)
                t0 = trio.current_time()
                self._in_flight.update(want)
                try:
                    if stream is None:  # one stream per peer, many requests on it
                        stream = await self.host.open_stream(peer, MODEL_CHUNKS, timeout=s.request_timeout_s)
                    reply = await self._ask(stream, want)
                except (SwarmError, FrameError, WireError) as e:
                    failures += 1
                    log.info("model chunks from %s failed (%d): %s", peer[-8:], failures, e)
                    if stream is not None:
                        await close_stream(stream, reset=True)
                        stream = None
                    if failures >= s.max_failures:
                        return
                    await trio.sleep(s.empty_backoff_s * failures)
                    continue
                finally:
                    self._in_flight.difference_update(want)
                failures = 0
                known = peer_has
                if peer_has is not None:
                    peer_has = from_bitmap(reply.have, self.copy.n)
                got = 0
                for frame in reply.chunks:
                    if reply.content_sha256 != m.content_sha256 or frame.index not in want \
                            or not self.copy.add(frame.index, frame.data):
                        log.warning("model %s: %s sent a bad chunk %d; not asking it again",
                                    m.content_sha256[:12], peer[-8:], frame.index)
                        self.bad_peers.add(peer)
                        self._poke()
                        return
                    got += len(frame.data)
                if got:
                    rate = got / max(1e-3, trio.current_time() - t0)
                    batch = next_batch(rate, m.chunk_bytes, s.target_request_s, s.batch)
                    self.from_peers[peer] = self.from_peers.get(peer, 0) + got
                    self._report_progress()
                    self._poke()
                elif want or peer_has == known:  # nothing new from this peer: ask again later
                    await trio.sleep(s.empty_backoff_s)
        except SwarmError as e:
            log.info("model holder %s unreachable: %s", peer[-8:], e)
        finally:
            self._workers.discard(peer)
            if stream is not None:
                await close_stream(stream, reset=False)

    def _report_progress(self) -> None:
        if self.progress is not None:
            elapsed = max(1e-6, time.monotonic() - self._t0)
            done = self.done_bytes()
            self.progress(done, self.copy.manifest.total_bytes, (done - self._bytes0) / elapsed, len(self._workers))
