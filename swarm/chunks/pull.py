"""Pulling one piece of content's chunks from several peers at once (``CHUNKS``).

One worker per peer: the *anchor* (the learner, which holds everything and is already connected)
and up to ``max_peers`` of the holders that ``sources()`` names (asked again every
``holder_refresh_s``; holders still pulling become holders of what they have). Each worker keeps
one stream open to its peer and asks it for the next wanted chunks that are missing, not already
asked of another peer and held by that peer (as its last reply's have-map said), checks every
chunk against the signed manifest and stores it. A first request with no indices only fetches
the peer's have-map. In a private run every request carries this host's membership ticket
(``swarm.membership``): nodes of such a run serve only members.

- A peer that sends a bad chunk (wrong hash, size or index, or another content) is never asked
  again (``bad_peers``); the chunk goes back to the pool and another peer supplies it.
- A peer that fails ``max_failures`` requests in a row (a stalled one runs into
  ``request_timeout_s``; its chunks are asked of the others meanwhile), or as often withholds
  chunks its have-map names, is dropped until the next holder refresh. A holder with nothing
  wanted makes room for another when more holders are known than ``max_peers``.
- ``anchor_last``: the anchor is asked only for chunks no live holder's have-map names, and only
  once every holder answered its first request (or ``probe_wait_s`` passed): the learner's upload
  is shared by the whole swarm (adapter repair). Otherwise it is asked alongside the holders
  (the base model: holders are few at first).
- Each peer's batch follows its measured rate, so one request takes about ``target_request_s``,
  and on a long link at least ``RTTS_PER_REQUEST`` of its round trips (the muxer's measurement),
  so the round trip between a reply and the next request leaves the link idle little (the
  muxer's receive window grows to the bandwidth-delay product by itself: yamux auto-tuning).

:meth:`Puller.run` returns when the store is complete and raises :class:`PullError` when nothing
new arrived for ``give_up_s``. The decisions (``swarm.chunks.choice``) are pure functions.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Awaitable, Callable

import trio

from swarm.changes import Changes

from swarm.chunks.choice import PullSettings, for_anchor, next_batch, pick_chunks
from swarm.chunks.manifest import held_bytes
from swarm.chunks.store import ChunkStore, from_bitmap
from swarm.chunks.streams import close_stream
from swarm.errors import EndOfStream, FrameError, SwarmError
from swarm.budget import budget_for
from swarm.framing import read_frame, write_frame
from swarm.membership import membership_of, pack_ticket
from swarm.proto import CHUNKS
from swarm.proto.chunks import MAX_REQUEST_CHUNKS, ChunkReply, ChunkRequest, PeerRef
from swarm.wire import WireError

log = logging.getLogger(__name__)


class PullError(Exception):
    """The content could not be pulled (nothing new arrived for ``give_up_s``)."""


Sources = Callable[[], Awaitable[list[PeerRef]]]
#: ``progress(bytes_held, total_bytes, bytes_per_s, active_peers)`` after each batch received.
Progress = Callable[[int, int, float, int], None]


class Puller:
    def __init__(self, host, store: ChunkStore, content_id: bytes, sources: Sources, *, anchor: str = "",
                 anchor_last: bool = False, settings: PullSettings | None = None,
                 wanted: Callable[[], list[int]] | None = None,
                 add: Callable[[int, bytes, str], bool] | None = None,
                 changed: Callable[[], Awaitable[None]] | None = None,
                 idle_since: Callable[[], float] | None = None,
                 progress: Progress | None = None,
                 report: Callable[["Puller"], Awaitable[None]] | None = None,
                 bad_peers: set[str] | None = None) -> None:
        """``sources()``: the current holders; ``anchor``: a connected peer that holds everything
        (the learner; "" for none); ``wanted()``: the chunks to pull now (default: every missing
        one); ``add(index, data, peer)``: store a chunk (default ``store.add``); ``changed()``:
        returns when the store changed by other means (e.g. a push); ``idle_since()``: the time
        (``trio.current_time()``) of the last progress (default: of this puller's last chunk);
        ``report(puller)``: runs every refresh and at the end; ``bad_peers``: peers never asked."""
        self.host = host
        self.store = store
        self.content_id = content_id
        self.sources = sources
        self.anchor = anchor
        self.anchor_last = anchor_last
        self.settings = settings or PullSettings()
        self._wanted = wanted or store.missing
        self._add = add or (lambda i, data, peer: store.add(i, data))
        self._changed_by_others = changed
        self._last_chunk_at: float = 0.0  # trio.s clock, set below
        self._idle_since = idle_since or (lambda: self._last_chunk_at)
        self.progress = progress
        self.report = report
        #: Peers that sent bad data: never asked again.
        self.bad_peers: set[str] = bad_peers if bad_peers is not None else set()
        #: Chunk bytes received per peer, and the peers dropped (at least once, until a refresh
        #: started them again) for failing, stalling or withholding what their have-map names.
        self.from_peers: dict[str, int] = {}
        self.dropped: set[str] = set()
        #: Seconds the pull took (0 until complete).
        self.fetch_s = 0.0
        self._rng = random.Random()
        self._start = self._rng.randrange(max(1, store.n))
        self._in_flight: set[int] = set()
        #: Live workers' have-maps (None: the anchor, which holds everything).
        self._haves: dict[str, set[int] | None] = {}
        self._probed: set[str] = set()
        #: Holders named by the last refresh.
        self._known: set[str] = set()
        self._changed = Changes()
        self._last_chunk_at = trio.current_time()
        self._t0 = time.monotonic()
        self._bytes0 = self.held_bytes()

    @property
    def me(self) -> str:
        return getattr(self.host, "peer_id", "")

    def held_bytes(self) -> int:
        m = self.store.manifest
        return held_bytes(m, self.store.count(), self.store.has(self.store.n - 1))

    # ------------------------------------------------------------------ the whole pull
    async def run(self) -> None:
        """Pull every missing chunk; raises :class:`PullError` when stuck for ``give_up_s``."""
        if not self.store.missing():
            return
        s = self.settings
        first = self._choose(await self._holder_refs())
        # Dial the holders chosen now before any worker starts, so the anchor (connected
        # already) does not serve everything while the holders' dials are under way.
        async with trio.open_nursery() as dials:
            for ref in first:
                dials.start_soon(self._dial, ref)
        stuck = ""
        async with trio.open_nursery() as nursery:
            self._spawn(nursery, first)
            nursery.start_soon(self._refresh_loop, nursery)
            if self._changed_by_others is not None:
                nursery.start_soon(self._watch_store)
            while self.store.missing():
                left = self._idle_since() + s.give_up_s - trio.current_time()
                if left <= 0:
                    stuck = (f"no new chunk for {s.give_up_s:.0f} s; {len(self.store.missing())} of "
                             f"{self.store.n} chunks missing (peers tried: {len(self.from_peers)})")
                    break
                with trio.move_on_after(left):
                    await self._changed.wait()
            self.fetch_s = time.monotonic() - self._t0
            nursery.cancel_scope.cancel()
        if stuck:
            raise PullError(stuck)
        await self._report()

    def _poke(self) -> None:
        self._changed.notify()

    async def _watch_store(self) -> None:
        while True:
            await self._changed_by_others()  # type: ignore[misc]
            self._poke()

    async def _report(self) -> None:
        if self.report is None:
            return
        try:
            with trio.fail_after(self.settings.request_timeout_s):
                await self.report(self)
        except (SwarmError, WireError, trio.TooSlowError) as e:
            log.info("progress report failed: %s", e)

    async def _refresh_loop(self, nursery: trio.Nursery) -> None:
        while True:
            if self.store.count():
                await self._report()
            self._spawn(nursery, await self._holder_refs())
            await trio.sleep(self.settings.holder_refresh_s)

    async def _holder_refs(self) -> list[PeerRef]:
        """The current holders (other than this peer), or none when they cannot be had."""
        try:
            with trio.fail_after(self.settings.request_timeout_s):
                refs = await self.sources()
        except (SwarmError, WireError, trio.TooSlowError) as e:
            log.info("holder refresh failed: %s", e)
            return []
        self._known = {r.peer_id for r in refs if r.peer_id not in (self.me, self.anchor)}
        return [r for r in refs if r.peer_id not in (self.me, self.anchor) and r.peer_id not in self.bad_peers]

    def _choose(self, refs: list[PeerRef]) -> list[PeerRef]:
        """Holders to start workers for: random ones not running, up to ``max_peers`` running."""
        free = [r for r in refs if r.peer_id not in self._haves and r.peer_id not in self.bad_peers]
        self._rng.shuffle(free)
        live = sum(1 for p in self._haves if p != self.anchor)
        return free[: max(0, self.settings.max_peers - live)]

    def _spares(self) -> bool:
        """Whether a known holder waits for a free slot (then an idle worker makes room)."""
        return any(p not in self._haves and p not in self.bad_peers and p not in self.dropped for p in self._known)

    def _spawn(self, nursery: trio.Nursery, refs: list[PeerRef]) -> None:
        """Start the anchor's worker (again, if it gave up) and holders' up to ``max_peers``."""
        if self.anchor and self.anchor != self.me and self.anchor not in self._haves \
                and self.anchor not in self.bad_peers:
            self._start_worker(nursery, PeerRef(self.anchor, []))
        for ref in self._choose(refs):
            self._start_worker(nursery, ref)

    def _start_worker(self, nursery: trio.Nursery, ref: PeerRef) -> None:
        self._haves[ref.peer_id] = None if ref.peer_id == self.anchor else set()
        nursery.start_soon(self._worker, ref)

    async def _dial(self, ref: PeerRef) -> bool:
        """Connect to ``ref`` at one of its addresses (True: connected)."""
        if ref.peer_id == self.anchor:
            return True
        last: Exception | None = None
        with trio.move_on_after(self.settings.dial_timeout_s):
            for addr in ref.addrs:
                try:
                    await self.host.connect(addr)
                    return True
                except SwarmError as e:
                    last = e
        log.info("holder %s unreachable: %s", ref.peer_id[-8:], last or "no address answered in time")
        return False

    # ------------------------------------------------------------------ one peer
    def _pick(self, peer: str, batch: int) -> list[int]:
        wanted = self._wanted()
        if peer == self.anchor and self.anchor_last:
            wanted = for_anchor(wanted, [h for p, h in self._haves.items() if h is not None and p != peer])
        return pick_chunks(wanted, self._in_flight, self._haves.get(peer), min(batch, MAX_REQUEST_CHUNKS), self._start)

    async def _wait_probes(self) -> None:
        """Until every live holder answered once (bounded by ``probe_wait_s``)."""
        with trio.move_on_after(self.settings.probe_wait_s):
            while any(p != self.anchor and p not in self._probed for p in self._haves):
                await self._changed.wait()

    async def _ask(self, stream, want: list[int]) -> ChunkReply:
        s, cap = self.settings, self.host.config.max_frame_bytes
        req = ChunkRequest(self.content_id, want, pack_ticket(membership_of(self.host).ticket))  # private runs
        await write_frame(stream, req.to_wire(), timeout=s.request_timeout_s, max_size=cap)
        try:
            raw = await read_frame(stream, max_size=cap, timeout=s.request_timeout_s, budget=budget_for(ChunkReply))
        except EndOfStream as e:
            raise FrameError("the peer closed the chunk stream") from e
        return ChunkReply.from_wire(raw)

    def _take(self, peer: str, want: list[int], reply: ChunkReply) -> int | None:
        """Store the reply's chunks; the bytes taken, or None when the peer sent bad data."""
        got = 0
        if reply.content_id != self.content_id:
            log.warning("%s answered for another content; not asking it again", peer[-8:])
            return None
        for frame in reply.chunks:
            if frame.index not in want or not self._add(frame.index, frame.data, peer):
                log.warning("%s sent a bad chunk %d; not asking it again", peer[-8:], frame.index)
                return None
            got += len(frame.data)
        return got

    async def _worker(self, ref: PeerRef) -> None:
        s, peer = self.settings, ref.peer_id
        anchor = peer == self.anchor
        failures, idle, batch, stream = 0, 0, 1, None
        try:
            if not anchor and not await self._dial(ref):
                self.dropped.add(peer)
                return
            if anchor and self.anchor_last:
                await self._wait_probes()
            while self.store.missing():
                want = self._pick(peer, batch)
                if anchor and not want:  # nothing for the anchor now (all asked, or held by holders)
                    with trio.move_on_after(s.empty_backoff_s):
                        await self._changed.wait()
                    continue
                t0 = trio.current_time()
                self._in_flight.update(want)
                try:
                    if stream is None:  # one stream per peer, many requests on it
                        stream = await self.host.open_stream(peer, CHUNKS, timeout=s.request_timeout_s)
                    reply = await self._ask(stream, want)
                except (SwarmError, FrameError, WireError) as e:
                    failures += 1
                    log.info("chunks from %s failed (%d): %s", peer[-8:], failures, e)
                    if stream is not None:
                        await close_stream(stream, reset=True)
                        stream = None
                    if failures >= s.max_failures:
                        self.dropped.add(peer)
                        return
                    await trio.sleep(s.empty_backoff_s * failures)
                    continue
                finally:
                    self._in_flight.difference_update(want)
                known = self._haves.get(peer)
                if not anchor:
                    self._haves[peer] = from_bitmap(reply.have, self.store.n)
                self._probed.add(peer)
                got = self._take(peer, want, reply)
                if got is None:
                    self.bad_peers.add(peer)
                    return
                if got:
                    failures = idle = 0
                    self._last_chunk_at = trio.current_time()
                    batch = next_batch(got / max(1e-3, self._last_chunk_at - t0), self.store.manifest.chunk_bytes,
                                       s.target_request_s, s.batch, self.host.rtt(peer) or 0.0)
                    self.from_peers[peer] = self.from_peers.get(peer, 0) + got
                    self._report_progress()
                    self._poke()
                    continue
                self._poke()  # a first have-map may let the anchor start
                has = self._haves.get(peer)
                if want and (has is None or has.intersection(want)):
                    failures += 1  # it withholds chunks it says it holds: as good as a failed request
                    if failures >= s.max_failures:
                        log.info("%s keeps withholding chunks it claims; dropped", peer[-8:])
                        self.dropped.add(peer)
                        return
                else:
                    failures = 0
                idle = 0 if has is None or has.intersection(self._wanted()) else idle + 1
                if idle >= s.max_failures and self._spares():
                    return  # it holds nothing we want: make room for another holder
                if want or has == known:  # nothing new from this peer: ask again later
                    await trio.sleep(s.empty_backoff_s)
        except SwarmError as e:
            log.info("holder %s unreachable: %s", peer[-8:], e)
            self.dropped.add(peer)
        finally:
            self._haves.pop(peer, None)
            self._probed.discard(peer)
            self._poke()
            if stream is not None:
                await close_stream(stream, reset=False)

    def _report_progress(self) -> None:
        if self.progress is not None:
            done = self.held_bytes()
            rate = (done - self._bytes0) / max(1e-6, time.monotonic() - self._t0)
            self.progress(done, self.store.manifest.total_bytes, rate, len(self._haves))
