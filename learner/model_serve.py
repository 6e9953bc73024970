"""The learner's side of the base model: its identity, its signed manifest, chunk serving,
holder tracking, and the hello check.

At start the learner describes the model it trains (``model.name``: the default GGUF, a GGUF
path or an HF directory) by its content hash (``swarm.content.model_id``), builds the chunk
manifest (cached after the first time) and signs it with its host key. It then serves:

- ``MODEL_MANIFEST``: the signed manifest and the peers that hold the model, fully or in
  part (nodes report themselves with ``MODEL_HAVE`` while fetching and once complete);
- ``CHUNKS``: chunks of its own files, through the host's chunk server (``swarm.chunks``).

Both are open to peers that have not said hello yet: a node fetches the model before it can
load its backend and say hello. :func:`hello_model_check` decides whether a node's model is
the run's (pure; called from ``LearnerService.on_hello``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import trio

from swarm.chunks.serve import ChunkServer, chunk_server
from swarm.content.manifest import DEFAULT_CHUNK_BYTES, build_model_manifest, model_content_id, sign_model_manifest
from swarm.content.model_id import short
from swarm.content.store import ModelCopy
from swarm.proto import MODEL_HAVE, MODEL_MANIFEST
from swarm.proto.chunks import PeerRef
from swarm.proto.model import (MAX_HOLDERS, ModelHave, ModelHaveAck, ModelManifest, ModelManifestReply,
                               ModelManifestRequest)

log = logging.getLogger("echo_swarm.learner")

#: Key of ``Hello.extra`` where a node names its model (for the refusal message).
HELLO_MODEL_NAME_KEY = "model"


def hello_model_check(node_sha: str, node_model: str, run_sha: str, run_model: str) -> str:
    """Why a node with model ``node_sha`` may not join a run of ``run_sha`` ("" = it may).
    An empty ``run_sha`` disables the check."""
    if not run_sha or node_sha == run_sha:
        return ""
    needs = f"this run needs {run_model} (sha256 {short(run_sha)})"
    if not node_sha:
        return f"model unknown: the node did not say which base model it holds; {needs}"
    has = f"{node_model or 'a model'} (sha256 {short(node_sha)})"
    return (f"model mismatch: the node has {has}, {needs}; join without --model to fetch the run's model, "
            f"or pass --model with a copy of it")


class LearnerModelServe:
    def __init__(self, host, manifest: ModelManifest, source: Path, server: ChunkServer | None = None) -> None:
        self.host = host
        self.manifest = manifest
        self.source = Path(source)
        #: The host's chunk server (shared with the adapter dissemination).
        self.server = server if server is not None else chunk_server(host)
        #: Model bytes served per peer.
        self.served: dict[str, int] = {}
        #: peer id -> its latest report.
        self.holders: dict[str, ModelHave] = {}
        #: Name holders in manifest replies (False: every node fetches from the learner alone;
        #: the baseline of ``swarm-bench model-fetch``).
        self.share_holders = True
        #: Monotonic times of the first manifest request and of each node's completion report.
        self.first_request_at: float | None = None
        self.completed_at: dict[str, float] = {}
        self._changed = trio.Event()

    @property
    def content_sha256(self) -> str:
        return self.manifest.content_sha256

    def register(self) -> None:
        self.server.add(model_content_id(self.manifest), ModelCopy(self.manifest, source=self.source), self._count)
        self.host.set_handler(MODEL_MANIFEST, ModelManifestRequest, self.on_manifest)
        self.host.set_handler(MODEL_HAVE, ModelHave, self.on_have)

    def _count(self, peer: str, n: int) -> None:
        self.served[peer] = self.served.get(peer, 0) + n

    def holder_refs(self, exclude: str = "") -> list[PeerRef]:
        """Complete holders first, then the partial ones with the most chunks."""
        ranked = sorted((h for p, h in self.holders.items() if p != exclude and h.chunks > 0 and h.addrs),
                        key=lambda h: (not h.complete, -h.chunks))
        by_report = {id(h): p for p, h in self.holders.items()}
        return [PeerRef(by_report[id(h)], list(h.addrs)) for h in ranked[:MAX_HOLDERS]]

    async def on_manifest(self, msg: ModelManifestRequest, peer_id: str) -> ModelManifestReply:
        if msg.content_sha256 and msg.content_sha256 != self.content_sha256:
            return ModelManifestReply(reason=f"this run's model is {self.manifest.name} "
                                             f"(sha256 {short(self.content_sha256)}), not {short(msg.content_sha256)}")
        if self.first_request_at is None:
            self.first_request_at = trio.current_time()
        return ModelManifestReply(self.manifest, self.holder_refs(exclude=peer_id) if self.share_holders else [])

    async def on_have(self, msg: ModelHave, peer_id: str) -> ModelHaveAck:
        if msg.content_sha256 != self.content_sha256:
            log.warning("model: %s reported another model %s", peer_id[-6:], short(msg.content_sha256))
            return ModelHaveAck(ok=False)
        before = self.holders.get(peer_id)
        if before is not None and (before.complete, before.chunks) > (msg.complete, msg.chunks):
            return ModelHaveAck()  # a late progress report: what the node holds only grows
        self.holders[peer_id] = msg
        if msg.complete and (before is None or not before.complete):
            self.completed_at[peer_id] = trio.current_time()
            peers = ", ".join(f"{p[-6:]}: {b / 1e6:.1f} MB" for p, b in sorted(msg.from_peers.items()))
            log.info("model: %s holds %s%s", peer_id[-6:], self.manifest.name,
                     f" (fetched in {msg.fetch_s:.1f} s from {peers})" if msg.from_peers else "")
        self._changed.set()
        self._changed = trio.Event()
        return ModelHaveAck()

    async def wait_complete(self, peers: int, timeout_s: float) -> bool:
        """Until ``peers`` nodes hold the complete model (bounded)."""
        with trio.move_on_after(timeout_s):
            while sum(1 for h in self.holders.values() if h.complete) < peers:
                await self._changed.wait()
            return True
        return False

    def summary(self) -> dict:
        """Per-node fetch figures (for ``swarm.json``)."""
        return {"content_sha256": self.content_sha256, "name": self.manifest.name,
                "bytes": self.manifest.total_bytes, "served_by_learner": dict(self.served),
                "holders": {p: {"complete": h.complete, "chunks": h.chunks, "fetch_s": h.fetch_s,
                                "from_peers": dict(h.from_peers)} for p, h in self.holders.items()}}


async def start_model_serve(host, source: Path, name: str, cache_dir: Path | None = None,
                            chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> LearnerModelServe:
    """Describe, sign and serve the model at ``source`` (hashing runs in a thread; cached)."""
    manifest = await trio.to_thread.run_sync(
        lambda: build_model_manifest(Path(source), name=name, signer=host.peer_id, chunk_bytes=chunk_bytes,
                                     cache_dir=cache_dir))
    sign_model_manifest(manifest, host.private_key())
    serve = LearnerModelServe(host, manifest, Path(source))
    serve.register()
    log.info("model: serving %s (sha256 %s, %.1f MB in %d chunks)", name, short(manifest.content_sha256),
             manifest.total_bytes / 1e6, len(manifest.chunk_hashes))
    return serve
