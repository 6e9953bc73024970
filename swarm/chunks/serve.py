"""Serving chunks to other peers (``CHUNKS``): one server per host, for every content it holds.

A host holds several pieces of content at once (the base model, a few adapter versions and their
layer-range slices), all served on the one ``CHUNKS`` protocol: each role adds its stores under
their content ids (:meth:`ChunkServer.add`), or a lookup that finds them (:meth:`ChunkServer.add_lookup`:
the adapter dissemination's version store, whose versions come and go). :func:`chunk_server` gives
a host's server, made and registered on first use, so every role on a host shares it.

One stream carries any number of request/reply frame pairs; the server closes a stream idle for
``stream_idle_s``. A reply holds the requested chunks the store has (up to ``max_reply_bytes``)
and the store's have-map; replies are never zstd-compressed (model weights do not compress,
adapter chunks are zstd output already). Chunks are read in a thread (disk stores block).

A request may carry the asker's membership ticket (a private run's node shows it): it is handed to
the host's :class:`~swarm.membership.Membership` before the request is answered, so a node's
``allow`` (``Membership.allows``) knows the asker as a member until its ticket expires.
"""

from __future__ import annotations

import itertools
import logging
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import trio

from swarm.chunks.store import ChunkStore
from swarm.chunks.streams import close_stream
from swarm.errors import EndOfStream, FrameError, SwarmError
from swarm.budget import budget_for
from swarm.framing import read_frame, write_frame
from swarm.gate import RateLimited, refuse
from swarm.membership import membership_of, unpack_ticket
from swarm.proto import CHUNKS
from swarm.proto.chunks import ChunkFrame, ChunkReply, ChunkRequest
from swarm.wire import WireError

if TYPE_CHECKING:
    from swarm.host import SwarmHost

log = logging.getLogger(__name__)

#: ``on_served(peer_id, bytes)``: called after each reply that carried chunks.
OnServed = Callable[[str, int], None]
#: Finds the store of a content id (None: not held).
Lookup = Callable[[bytes], "ChunkStore | None"]
#: Whether a peer id may read a content (None: anyone may); a refused peer is told "not held".
Allow = Callable[[str], bool]


@dataclass
class ServeSettings:
    #: Largest reply body, bytes (keep well below the hosts' frame cap).
    max_reply_bytes: int = 8 * 1024 * 1024
    #: A chunk stream idle this long (s) between requests is closed by the server.
    stream_idle_s: float = 60.0
    #: Deadline (s) for writing one reply.
    write_timeout_s: float = 30.0


@dataclass
class _Entry:
    store: ChunkStore | None  # None: a lookup's, found per request
    on_served: OnServed | None = None
    allow: Allow | None = None


@dataclass
class ChunkServer:
    host: SwarmHost
    settings: ServeSettings = field(default_factory=ServeSettings)
    #: Bytes served per peer (every content).
    served: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._entries: dict[bytes, _Entry] = {}
        self._lookups: list[tuple[Lookup, _Entry]] = []
        self._registered = False

    @property
    def max_reply_bytes(self) -> int:
        return self.settings.max_reply_bytes

    @max_reply_bytes.setter
    def max_reply_bytes(self, value: int) -> None:
        self.settings.max_reply_bytes = value

    def register(self) -> None:
        if not self._registered:
            self.host.set_stream_handler(CHUNKS, self._on_stream)
            self._registered = True

    def add(self, content_id: bytes, store: ChunkStore, on_served: OnServed | None = None,
            allow: Allow | None = None) -> None:
        """Serve ``store`` as ``content_id`` (replacing what was served under it), to the peers
        ``allow`` accepts (None: any)."""
        self._entries[content_id] = _Entry(store, on_served, allow)

    def remove(self, content_id: bytes) -> None:
        self._entries.pop(content_id, None)

    def add_lookup(self, lookup: Lookup, on_served: OnServed | None = None, allow: Allow | None = None) -> None:
        """Serve whatever ``lookup`` finds (asked after the stores added with :meth:`add`), to the
        peers ``allow`` accepts (None: any)."""
        self._lookups.append((lookup, _Entry(None, on_served, allow)))

    def find(self, content_id: bytes, peer: str | None = None) -> tuple[ChunkStore, OnServed | None] | None:
        """The store of ``content_id`` and its ``on_served`` (None: not held, or ``peer`` may not read it)."""
        entry = self._entries.get(content_id)
        if entry is None:
            for lookup, found in self._lookups:
                store = lookup(content_id)
                if store is not None:
                    entry = _Entry(store, found.on_served, found.allow)
                    break
        if entry is None or entry.store is None:
            return None
        if peer is not None and entry.allow is not None and not entry.allow(peer):
            log.info("chunks: %s may not read content %s (private run): answered as not held", peer[-8:],
                     content_id.hex()[:12])
            return None
        return entry.store, entry.on_served

    async def _on_stream(self, stream, peer: str) -> None:
        s, cap = self.settings, self.host.config.max_frame_bytes
        ok = False
        # every request frame after the stream's first counts against the peer's request budget
        next_request = getattr(stream, "next_request", None)
        try:
            for n in itertools.count():
                try:
                    raw = await read_frame(stream, max_size=cap, timeout=s.stream_idle_s, budget=budget_for(ChunkRequest))
                    if n and next_request is not None:
                        next_request()
                except EndOfStream:
                    ok = True
                    return
                reply = await self.on_chunks(ChunkRequest.from_wire(raw), peer)
                await write_frame(stream, reply.to_wire(), timeout=s.write_timeout_s, compress_threshold=cap,
                                  max_size=cap)
        except RateLimited as e:  # logged by the gate; the puller gets the reason and asks elsewhere
            await refuse(stream, str(e))
            ok = True
        except (SwarmError, FrameError, WireError) as e:
            log.info("chunk stream from %s ended: %s: %s", peer[-8:], type(e).__name__, e)
        except Exception as e:  # a failing read must never take the host down
            log.warning("chunk stream from %s failed: %s: %s", peer[-8:], type(e).__name__, e)
        finally:
            await close_stream(stream, reset=not ok)

    async def on_chunks(self, msg: ChunkRequest, peer: str) -> ChunkReply:
        if msg.ticket:
            ticket = unpack_ticket(msg.ticket)
            if ticket is not None:
                membership_of(self.host).present(peer, ticket)
        found = self.find(msg.content_id, peer)
        if found is None:
            return ChunkReply(msg.content_id)
        store, on_served = found
        wanted = [i for i in msg.indices if store.has(i)]
        out = await trio.to_thread.run_sync(read_chunks, store, wanted, self.settings.max_reply_bytes) if wanted else []
        sent = sum(len(f.data) for f in out)
        if sent:
            self.served[peer] = self.served.get(peer, 0) + sent
            if on_served is not None:
                on_served(peer, sent)
        return ChunkReply(msg.content_id, out, store.have_bitmap())


def read_chunks(store: ChunkStore, wanted: list[int], max_bytes: int) -> list[ChunkFrame]:
    """Chunks ``wanted`` that ``store`` holds, in order, until ``max_bytes`` (at least one)."""
    out: list[ChunkFrame] = []
    size = 0
    for i in wanted:
        data = store.read(i)
        if data is None:
            continue
        if out and size + len(data) > max_bytes:
            break
        out.append(ChunkFrame(i, data))
        size += len(data)
    return out


_servers: "weakref.WeakKeyDictionary[object, ChunkServer]" = weakref.WeakKeyDictionary()


def chunk_server(host) -> ChunkServer:
    """``host``'s chunk server, made and registered on first use (one per host: every role on
    the host serves its content through it)."""
    server = _servers.get(host)
    if server is None:
        server = _servers[host] = ChunkServer(host)
        server.register()
    return server
