"""Chunk transfer messages shared by every content kind (adapter versions, the base model).

One ``CHUNKS`` stream carries any number of :class:`ChunkRequest` / :class:`ChunkReply` frame
pairs (the puller keeps one stream per peer open). Content is named by its *content id*: the
SHA-256 of its signed manifest's signing payload (``swarm.chunks.manifest.content_id``), so a
request never needs to know which kind of content it is for. Push streams down the adapter
broadcast tree carry :class:`ChunkFrame` too (``swarm.proto.dissem``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swarm.proto.membership import MAX_TICKET_BYTES
from swarm.wire import Message, bounded, bounded_default

#: Most chunks of one piece of content.
MAX_CHUNKS = 1_000_000
#: Most chunk indices asked for in one request.
MAX_REQUEST_CHUNKS = 4096
#: Length of a content id (SHA-256).
CONTENT_ID_BYTES = 32


@dataclass
class PeerRef(Message):
    """A peer that holds (or will hold) content, and where to dial it."""

    KIND = "peer_ref"
    peer_id: str = bounded(max_items=128)
    #: Multiaddrs (each ending in ``/p2p/<peer id>``) the peer can be dialled on.
    addrs: list[str] = bounded(max_items=16, max_len=512)


@dataclass
class ChunkFrame(Message):
    KIND = "chunk"
    index: int = bounded(min=0)
    data: bytes = b""


@dataclass
class ChunkRequest(Message):
    """Ask for chunks ``indices`` of the content ``content_id`` (an empty list only asks for
    the server's have-map). ``ticket``: the asker's membership ticket, packed
    (``swarm.membership.pack_ticket``: a flat bytes field keeps the request's decode budget small),
    in a private run, whose nodes serve only members; empty elsewhere, and from older peers."""

    KIND = "chunk_request"
    content_id: bytes = bounded(max_items=CONTENT_ID_BYTES)
    indices: list[int] = bounded(max_items=MAX_REQUEST_CHUNKS)
    ticket: bytes = bounded_default(b"", max_items=MAX_TICKET_BYTES)


@dataclass
class ChunkReply(Message):
    """The requested chunks the server holds (possibly none, possibly fewer than asked), and
    its have-map: a bitmap of every chunk it holds (bit ``i % 8`` of byte ``i // 8``), so the
    asker can pick what to ask it for next. Empty ``have``: the server does not hold the content."""

    KIND = "chunk_reply"
    content_id: bytes = bounded(max_items=CONTENT_ID_BYTES)
    chunks: list[ChunkFrame] = field(default_factory=list, metadata={"max_items": MAX_REQUEST_CHUNKS})
    have: bytes = field(default=b"", metadata={"max_items": (MAX_CHUNKS + 7) // 8})
