"""Base-model transfer messages: the learner's signed model manifest and holder reports
(see ``swarm.content``). Chunks travel on the chunk layer (``swarm.proto.chunks``).

A model travels as the concatenation of its files (in manifest order) cut into
``chunk_bytes`` chunks; every chunk has its SHA-256 in the manifest, and the manifest is
signed by the learner's libp2p key (``swarm.content.manifest``).
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.proto.chunks import MAX_CHUNKS, PeerRef
from swarm.proto.membership import MembershipTicket
from swarm.wire import Message, bounded, bounded_default

#: Most files in one model directory.
MAX_FILES = 10_000
#: Most holders named in one manifest reply.
MAX_HOLDERS = 64


@dataclass
class ModelFile(Message):
    KIND = "model_file"
    #: Path relative to the model root, POSIX separators (the file's own name for a GGUF).
    relpath: str = bounded(max_items=4096)
    size: int = bounded(min=0)
    #: Hex SHA-256 of the file's bytes.
    sha256: str = bounded(max_items=64)


@dataclass
class ModelManifest(Message):
    """Everything a node needs to fetch and check a base model."""

    KIND = "model_manifest"
    #: The model's content hash (``swarm.content.model_id``): hex SHA-256.
    content_sha256: str = bounded(max_items=64)
    #: Human-readable name (``default``, a file or directory name).
    name: str = bounded(max_items=256)
    #: ``gguf`` (one GGUF file) or ``hf`` (an HF model directory).
    kind: str = bounded(max_items=16)
    #: Files in transfer order (sorted by ``relpath``).
    files: list[ModelFile] = bounded(max_items=MAX_FILES)
    #: Sum of the file sizes, bytes.
    total_bytes: int = bounded(min=0)
    #: Chunk size; the last chunk may be shorter.
    chunk_bytes: int = bounded(min=1, max=64 * 1024 * 1024)
    #: SHA-256 of every chunk, in order.
    chunk_hashes: list[bytes] = bounded(max_items=MAX_CHUNKS, max_len=32)
    #: Base58 peer id of the learner that signed it.
    signer: str = bounded(max_items=128)
    #: Ed25519 signature (empty while unsigned).
    signature: bytes = bounded_default(b"", max_items=128)


@dataclass
class ModelManifestRequest(Message):
    KIND = "model_manifest_request"
    #: Which model (empty: the run's).
    content_sha256: str = bounded_default("", max_items=64)
    #: The node's join token, for a private run's learner (``swarm-node join --token``); a
    #: learner of another kind ignores it.
    token: str = bounded_default("", max_items=1024)
    #: The form the node loads (a manifest ``kind``: ``gguf`` for llama.cpp); empty, or a form the
    #: learner does not serve: the model as the run gives it. Ignored when ``content_sha256`` is set.
    form: str = bounded_default("", max_items=16)


@dataclass
class ModelManifestReply(Message):
    KIND = "model_manifest_reply"
    manifest: ModelManifest | None = None
    #: Peers holding all or part of the model (the learner not included).
    holders: list[PeerRef] = bounded_default([], max_items=MAX_HOLDERS)
    #: Why there is no manifest.
    reason: str = ""
    #: A private run's membership ticket for the asker (``swarm.membership``; None: an open run).
    ticket: MembershipTicket | None = None


@dataclass
class ModelHave(Message):
    """A node holds (part of) a model and serves it at ``addrs``."""

    KIND = "model_have"
    content_sha256: str = bounded(max_items=64)
    addrs: list[str] = bounded(max_items=16, max_len=512)
    #: Verified chunks held.
    chunks: int = bounded(min=0)
    complete: bool = False
    #: Bytes received from each peer (peer id -> bytes) while fetching it.
    from_peers: dict[str, int] = bounded_default({}, max_items=4096)
    #: Seconds the fetch took (0: not fetched, e.g. held locally).
    fetch_s: float = bounded_default(0.0, min=0.0)


@dataclass
class ModelHaveAck(Message):
    KIND = "model_have_ack"
    ok: bool = True
