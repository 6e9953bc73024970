"""The learner's side of the base model: its identity, its signed manifest, chunk serving,
holder tracking, and the hello check.

At start the learner describes the model it trains (``model.name``: the default GGUF, a GGUF
path or an HF directory) by its content hash (``swarm.content.model_id``), builds the chunk
manifest (cached after the first time) and signs it with its host key. It then serves:

- ``MODEL_MANIFEST``: the signed manifest and the peers that hold the model, fully or in
  part (nodes report themselves with ``MODEL_HAVE`` while fetching and once complete);
- ``CHUNKS``: chunks of its own files, through the host's chunk server (``swarm.chunks``).

Both are open to peers that have not said hello yet (a node fetches the model before it can
load its backend and say hello), except in a private run (``network.private``): there only
admitted peers get the manifest and the chunks (``access``: :class:`learner.admission.ReadAccess`;
a node shows its join token with its manifest request) and every manifest reply to an admitted
peer carries a fresh membership ticket (:meth:`LearnerModelServe.ticket_for`, also put in the hello
ack), which nodes check before they serve the chunks they hold (``swarm.membership``). Holder reports (``MODEL_HAVE``) are kept
for peers that said hello; of the others, at most :data:`MAX_UNGREETED_HOLDERS` (newest kept, named
after the greeted ones, none in a private run), so strangers cannot grow the table or crowd
greeted holders out of manifest replies (at most ``MAX_HOLDERS`` holders of at most 16 addresses
each: far below the frame cap). :func:`hello_model_check` decides whether a node's model is
the run's (pure; called from ``LearnerService.on_hello``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import trio

from learner.admission import ReadAccess
from swarm.changes import Changes
from swarm.chunks.serve import ChunkServer, chunk_server
from swarm.content.manifest import DEFAULT_CHUNK_BYTES, build_model_manifest, model_content_id, sign_model_manifest
from swarm.content.model_id import short
from swarm.content.store import ModelCopy
from swarm.proto import MODEL_HAVE, MODEL_MANIFEST
from swarm.proto.chunks import PeerRef
from swarm.proto.membership import MembershipTicket
from swarm.proto.model import (MAX_HOLDERS, ModelHave, ModelHaveAck, ModelManifest, ModelManifestReply,
                               ModelManifestRequest)

log = logging.getLogger("echo_swarm.learner")

#: Key of ``Hello.extra`` where a node names its model (for the refusal message).
HELLO_MODEL_NAME_KEY = "model"
#: Most holder reports kept from peers that have not said hello (nodes still fetching).
MAX_UNGREETED_HOLDERS = 16


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
    def __init__(self, host, manifest: ModelManifest, source: Path, server: ChunkServer | None = None,
                 access: ReadAccess | None = None) -> None:
        self.host = host
        #: Who may read the model and the holders' addresses (None: anyone, all reports greeted).
        self.access = access
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
        self._changed = Changes()

    @property
    def content_sha256(self) -> str:
        return self.manifest.content_sha256

    def register(self) -> None:
        self.server.add(model_content_id(self.manifest), ModelCopy(self.manifest, source=self.source), self._count,
                        allow=None if self.access is None else self.access.allows)
        self.host.set_handler(MODEL_MANIFEST, ModelManifestRequest, self.on_manifest)
        self.host.set_handler(MODEL_HAVE, ModelHave, self.on_have)

    def _count(self, peer: str, n: int) -> None:
        self.served[peer] = self.served.get(peer, 0) + n

    def _greeted(self, peer_id: str) -> bool:
        return self.access is None or self.access.said_hello(peer_id)

    def holder_refs(self, exclude: str = "") -> list[PeerRef]:
        """Holders that said hello first (complete, then the most chunks), then the others."""
        ranked = sorted(((p, h) for p, h in self.holders.items() if p != exclude and h.chunks > 0 and h.addrs),
                        key=lambda ph: (not self._greeted(ph[0]), not ph[1].complete, -ph[1].chunks))
        return [PeerRef(p, list(h.addrs)) for p, h in ranked[:MAX_HOLDERS]]

    async def on_manifest(self, msg: ModelManifestRequest, peer_id: str) -> ModelManifestReply:
        if self.access is not None:
            self.access.show_token(peer_id, msg.token)
            refusal = self.access.refusal(peer_id)
            if refusal is not None:
                log.info("model: no manifest for %s: %s", peer_id[-6:], refusal)
                return ModelManifestReply(reason=refusal)
        if msg.content_sha256 and msg.content_sha256 != self.content_sha256:
            return ModelManifestReply(reason=f"this run's model is {self.manifest.name} "
                                             f"(sha256 {short(self.content_sha256)}), not {short(msg.content_sha256)}")
        if self.first_request_at is None:
            self.first_request_at = trio.current_time()
        return ModelManifestReply(self.manifest, self.holder_refs(exclude=peer_id) if self.share_holders else [],
                                  ticket=self.ticket_for(peer_id))

    def ticket_for(self, peer_id: str) -> MembershipTicket | None:
        """A private run's membership ticket for an admitted ``peer_id`` (None: an open run, or
        refused): in every manifest reply and hello ack (``swarm.membership``)."""
        return self.access.ticket(peer_id) if self.access is not None else None

    async def on_have(self, msg: ModelHave, peer_id: str) -> ModelHaveAck:
        if msg.content_sha256 != self.content_sha256:
            log.warning("model: %s reported another model %s", peer_id[-6:], short(msg.content_sha256))
            return ModelHaveAck(ok=False)
        refusal = self.access.refusal(peer_id) if self.access is not None else None
        if refusal is not None:
            log.info("model: ignored a holder report of %s: %s", peer_id[-6:], refusal)
            return ModelHaveAck(ok=False)
        before = self.holders.get(peer_id)
        if before is not None and (before.complete, before.chunks) > (msg.complete, msg.chunks):
            return ModelHaveAck()  # a late progress report: what the node holds only grows
        if not self._greeted(peer_id):
            if self.access.private:
                return ModelHaveAck(ok=False)
            ungreeted = [p for p in self.holders if p != peer_id and not self._greeted(p)]
            for p in ungreeted[:max(0, len(ungreeted) - MAX_UNGREETED_HOLDERS + 1)]:
                del self.holders[p]  # the oldest reports of strangers make room
        self.holders.pop(peer_id, None)  # re-inserted last: dict order is report order
        self.holders[peer_id] = msg
        if msg.complete and (before is None or not before.complete):
            self.completed_at[peer_id] = trio.current_time()
            peers = ", ".join(f"{p[-6:]}: {b / 1e6:.1f} MB" for p, b in sorted(msg.from_peers.items()))
            log.info("model: %s holds %s%s", peer_id[-6:], self.manifest.name,
                     f" (fetched in {msg.fetch_s:.1f} s from {peers})" if msg.from_peers else "")
        self._changed.notify()
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
                            chunk_bytes: int = DEFAULT_CHUNK_BYTES, access: ReadAccess | None = None) -> LearnerModelServe:
    """Describe, sign and serve the model at ``source`` (hashing runs in a thread; cached)."""
    manifest = await trio.to_thread.run_sync(
        lambda: build_model_manifest(Path(source), name=name, signer=host.peer_id, chunk_bytes=chunk_bytes,
                                     cache_dir=cache_dir))
    sign_model_manifest(manifest, host.private_key())
    serve = LearnerModelServe(host, manifest, Path(source), access=access)
    serve.register()
    log.info("model: serving %s (sha256 %s, %.1f MB in %d chunks)", name, short(manifest.content_sha256),
             manifest.total_bytes / 1e6, len(manifest.chunk_hashes))
    return serve
