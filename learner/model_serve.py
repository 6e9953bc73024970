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

Forms. A run's model is served as given (``model.name``) and, when that is an HF directory, also
as the GGUF a llama.cpp node loads (``model.gguf_outtype``, made once with llama.cpp's converter,
``node_agents.convert``, and cached), so that such a node never needs the converter, torch or
transformers. Each form has its own signed manifest, chunks and holders (:attr:`LearnerModelServe.forms`);
a node asks for the form it loads (``ModelManifestRequest.form``; an unknown or unserved form gets
the model as given), reports what it holds by that form's hash, and says hello with it: every
served form's hash is the run's model.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
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


def hello_model_check(node_sha: str, node_model: str, run_sha: str, run_model: str,
                      other_forms: Collection[str] = ()) -> str:
    """Why a node with model ``node_sha`` may not join a run of ``run_sha`` ("" = it may).
    ``other_forms``: hashes of the run's model in the other forms it is served in (a GGUF made
    from an HF directory). An empty ``run_sha`` disables the check."""
    if not run_sha or node_sha == run_sha or (node_sha and node_sha in other_forms):
        return ""
    needs = f"this run needs {run_model} (sha256 {short(run_sha)})"
    if not node_sha:
        return f"model unknown: the node did not say which base model it holds; {needs}"
    has = f"{node_model or 'a model'} (sha256 {short(node_sha)})"
    return (f"model mismatch: the node has {has}, {needs}; join without --model to fetch the run's model, "
            f"or pass --model with a copy of it")


class LearnerModelServe:
    def __init__(self, host, manifest: ModelManifest, source: Path, server: ChunkServer | None = None,
                 access: ReadAccess | None = None, forms: dict[str, LearnerModelServe] | None = None) -> None:
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
        #: The run's model in other forms (form name, e.g. ``gguf`` -> its server; none has forms).
        self.forms: dict[str, LearnerModelServe] = dict(forms or {})
        self._changed = Changes()

    @property
    def content_sha256(self) -> str:
        return self.manifest.content_sha256

    def register(self) -> None:
        """Serve every form's chunks, and answer manifest requests and holder reports."""
        for serve in (self, *self.forms.values()):
            serve.server.add(model_content_id(serve.manifest), ModelCopy(serve.manifest, source=serve.source),
                             serve._count, allow=None if serve.access is None else serve.access.allows)
        self.host.set_handler(MODEL_MANIFEST, ModelManifestRequest, self.on_manifest)
        self.host.set_handler(MODEL_HAVE, ModelHave, self.on_have)

    def form_shas(self) -> list[str]:
        """Hashes of the run's model in its other forms (for the hello check)."""
        return [f.content_sha256 for f in self.forms.values()]

    def _form_of(self, sha: str) -> LearnerModelServe | None:
        """The form whose hash is ``sha`` (None: the model as given, or no form of this run)."""
        return next((f for f in self.forms.values() if f.content_sha256 == sha), None)

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
        form = self._form_of(msg.content_sha256) if msg.content_sha256 else self.forms.get(msg.form)
        if form is not None:
            return await form.on_manifest(msg, peer_id)
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
        form = self._form_of(msg.content_sha256)
        if form is not None:
            ack = await form.on_have(msg, peer_id)
            self._changed.notify()
            return ack
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
            if self.access is not None and self.access.private:
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

    def complete_holders(self) -> int:
        """Nodes that hold the complete model, in any form."""
        return sum(1 for serve in (self, *self.forms.values()) for h in serve.holders.values() if h.complete)

    async def wait_complete(self, peers: int, timeout_s: float) -> bool:
        """Until ``peers`` nodes hold the complete model, in any form (bounded)."""
        with trio.move_on_after(timeout_s):
            while self.complete_holders() < peers:
                await self._changed.wait()
            return True
        return False

    def summary(self) -> dict:
        """Per-node fetch figures (for ``swarm.json``), with each other form's under ``forms``."""
        out = {"content_sha256": self.content_sha256, "name": self.manifest.name, "kind": self.manifest.kind,
               "bytes": self.manifest.total_bytes, "served_by_learner": dict(self.served),
               "holders": {p: {"complete": h.complete, "chunks": h.chunks, "fetch_s": h.fetch_s,
                               "from_peers": dict(h.from_peers)} for p, h in self.holders.items()}}
        if self.forms:
            out["forms"] = {name: form.summary() for name, form in self.forms.items()}
        return out


async def _signed_manifest(host, source: Path, name: str, cache_dir: Path | None, chunk_bytes: int) -> ModelManifest:
    """The manifest of the model at ``source``, signed with the host's key (hashing in a thread; cached)."""
    manifest = await trio.to_thread.run_sync(
        lambda: build_model_manifest(Path(source), name=name, signer=host.peer_id, chunk_bytes=chunk_bytes,
                                     cache_dir=cache_dir))
    sign_model_manifest(manifest, host.private_key())
    return manifest


async def start_model_serve(host, source: Path, name: str, cache_dir: Path | None = None,
                            chunk_bytes: int = DEFAULT_CHUNK_BYTES, access: ReadAccess | None = None,
                            gguf: Path | None = None) -> LearnerModelServe:
    """Describe, sign and serve the model at ``source``; ``gguf``: the same model as a GGUF, served
    as the ``gguf`` form beside an HF directory (see the module docstring)."""
    server = chunk_server(host)
    forms = {}
    if gguf is not None and Path(gguf) != Path(source):
        form = await _signed_manifest(host, Path(gguf), Path(gguf).name, cache_dir, chunk_bytes)
        forms[form.kind] = LearnerModelServe(host, form, Path(gguf), server=server, access=access)
    manifest = await _signed_manifest(host, Path(source), name, cache_dir, chunk_bytes)
    serve = LearnerModelServe(host, manifest, Path(source), server=server, access=access, forms=forms)
    serve.register()
    for each in (serve, *forms.values()):
        log.info("model: serving %s (%s, sha256 %s, %.1f MB in %d chunks)", each.manifest.name, each.manifest.kind,
                 short(each.manifest.content_sha256), each.manifest.total_bytes / 1e6, len(each.manifest.chunk_hashes))
    return serve
