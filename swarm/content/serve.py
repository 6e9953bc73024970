"""Serving model chunks to other peers (``MODEL_CHUNKS``): the learner serves the files it
trains on, every node serves what it holds, complete or not (a node still fetching is a
holder of its verified chunks). Each reply carries the server's bitmap of held chunks.

One ``MODEL_CHUNKS`` stream carries any number of request/reply frame pairs (the fetcher
keeps one stream per peer open), and replies are never zstd-compressed: model weights do not
compress, and the CPU is better spent hashing.
"""

from __future__ import annotations

import logging

import trio

from swarm.content.store import ModelCopy
from swarm.errors import EndOfStream, FrameError, SwarmError
from swarm.framing import read_frame, write_frame
from swarm.proto import MODEL_CHUNKS
from swarm.proto.dissem import ChunkFrame
from swarm.proto.model import ModelChunkReply, ModelChunkRequest
from swarm.wire import WireError

log = logging.getLogger(__name__)

#: Largest reply body, bytes (keep well below the hosts' frame cap).
MAX_REPLY_BYTES = 8 * 1024 * 1024
#: A chunk stream idle this long (s) between requests is closed by the server.
STREAM_IDLE_S = 60.0
#: Deadline (s) for writing one reply.
WRITE_TIMEOUT_S = 30.0


class ModelServer:
    def __init__(self, host, max_reply_bytes: int = MAX_REPLY_BYTES) -> None:
        self.host = host
        self.max_reply_bytes = max_reply_bytes
        self.copies: dict[str, ModelCopy] = {}
        #: Bytes served per peer (for reports and benchmarks).
        self.served: dict[str, int] = {}
        self._registered = False

    def register(self) -> None:
        if not self._registered:
            self.host.set_stream_handler(MODEL_CHUNKS, self._on_stream)
            self._registered = True

    def add(self, copy: ModelCopy) -> None:
        self.copies[copy.manifest.content_sha256] = copy

    async def _on_stream(self, stream, peer: str) -> None:
        cap = self.host.config.max_frame_bytes
        ok = False
        try:
            while True:
                try:
                    raw = await read_frame(stream, max_size=cap, timeout=STREAM_IDLE_S)
                except EndOfStream:
                    ok = True
                    return
                reply = await self.on_chunks(ModelChunkRequest.from_wire(raw), peer)
                await write_frame(stream, reply.to_wire(), timeout=WRITE_TIMEOUT_S, compress_threshold=cap, max_size=cap)
        except (SwarmError, FrameError, WireError) as e:
            log.info("model chunk stream from %s ended: %s: %s", peer[-8:], type(e).__name__, e)
        except Exception as e:  # a failing read must never take the host down
            log.warning("model chunk stream from %s failed: %s: %s", peer[-8:], type(e).__name__, e)
        finally:
            await close_stream(stream, reset=not ok)

    async def on_chunks(self, msg: ModelChunkRequest, peer: str) -> ModelChunkReply:
        copy = self.copies.get(msg.content_sha256)
        if copy is None:
            return ModelChunkReply(msg.content_sha256)
        wanted = [i for i in msg.indices if copy.has(i)]
        out = await trio.to_thread.run_sync(self._read, copy, wanted)
        sent = sum(len(f.data) for f in out)
        if sent:
            self.served[peer] = self.served.get(peer, 0) + sent
        return ModelChunkReply(msg.content_sha256, out, copy.have_bitmap())

    def _read(self, copy: ModelCopy, wanted: list[int]) -> list[ChunkFrame]:
        out: list[ChunkFrame] = []
        size = 0
        for i in wanted:
            data = copy.read(i)
            if data is None:
                continue
            if out and size + len(data) > self.max_reply_bytes:
                break
            out.append(ChunkFrame(i, data))
            size += len(data)
        return out


async def close_stream(stream, *, reset: bool) -> None:
    with trio.CancelScope(shield=True, deadline=trio.current_time() + 2.0):
        try:
            await (stream.reset() if reset else stream.close())
        except Exception as e:
            log.debug("closing a model chunk stream failed: %s", e)
