"""Serving model chunks to other peers (``MODEL_CHUNKS``): the learner serves the files it
trains on, every node serves what it holds, complete or not (a node still fetching is a
holder of its verified chunks). Each reply carries the server's bitmap of held chunks."""

from __future__ import annotations

import logging

import trio

from swarm.content.store import ModelCopy
from swarm.proto import MODEL_CHUNKS
from swarm.proto.dissem import ChunkFrame
from swarm.proto.model import ModelChunkReply, ModelChunkRequest

log = logging.getLogger(__name__)

#: Largest reply body, bytes (keep well below the hosts' frame cap).
MAX_REPLY_BYTES = 8 * 1024 * 1024


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
            self.host.set_handler(MODEL_CHUNKS, ModelChunkRequest, self.on_chunks)
            self._registered = True

    def add(self, copy: ModelCopy) -> None:
        self.copies[copy.manifest.content_sha256] = copy

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
