"""The manifest base every chunked content shares: chunk geometry, chunk checks, signing.

A chunked manifest (:class:`ChunkedManifest`: an adapter version's ``swarm.proto.dissem.Manifest``,
the base model's ``swarm.proto.model.ModelManifest``) describes ``total_bytes`` of payload cut
into ``chunk_bytes`` chunks (the last one may be shorter; an empty payload is one empty chunk)
with the SHA-256 of every chunk, and is signed by the learner's libp2p key.

Signing: the signature covers :func:`signing_payload`, a domain tag (one per manifest kind, so
a signature of one kind is never valid for another) followed by msgpack of the message's wire
dict without ``signature``, map keys sorted at every level, so signer and verifier serialise the
same fields identically whatever order a peer sent them in. The public key comes from the
learner's peer id (Ed25519 ids embed the key), never from the manifest or the peer that sent it.

A manifest's *content id* (:func:`content_id`) is the SHA-256 of its signing payload: what chunk
requests name, the same for every peer holding the same signed manifest.
"""

from __future__ import annotations

import hashlib
from typing import Any, Protocol

import msgpack

#: Bytes of a chunk hash (SHA-256).
HASH_BYTES = 32


class ManifestError(ValueError):
    """A manifest that is forged, altered, inconsistent or for another run or model."""


class ChunkedManifest(Protocol):
    """The fields every chunked manifest has."""

    @property
    def total_bytes(self) -> int: ...

    @property
    def chunk_bytes(self) -> int: ...

    @property
    def chunk_hashes(self) -> list[bytes]: ...

    @property
    def signer(self) -> str: ...

    @property
    def signature(self) -> bytes: ...

    def to_wire(self) -> dict[str, Any]: ...


# ---------------------------------------------------------------- chunk geometry
def chunk_hash(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def split_chunks(data: bytes, chunk_bytes: int) -> list[bytes]:
    """``data`` cut into ``chunk_bytes`` chunks (one empty chunk for empty data)."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    return [data[i: i + chunk_bytes] for i in range(0, len(data), chunk_bytes)] or [b""]


def expected_chunks(total_bytes: int, chunk_bytes: int) -> int:
    """How many chunks ``total_bytes`` make (at least one)."""
    return max(1, -(-total_bytes // chunk_bytes))


def chunk_range(m: ChunkedManifest, index: int) -> tuple[int, int]:
    """``(offset, size)`` of chunk ``index`` in the payload."""
    if not 0 <= index < len(m.chunk_hashes):
        raise IndexError(f"chunk {index} of {len(m.chunk_hashes)}")
    start = index * m.chunk_bytes
    return start, min(m.chunk_bytes, m.total_bytes - start)


def chunk_ok(m: ChunkedManifest, index: int, data: bytes) -> bool:
    """Whether ``data`` is chunk ``index`` of ``m`` (right size and SHA-256)."""
    if not 0 <= index < len(m.chunk_hashes):
        return False
    return len(data) == chunk_range(m, index)[1] and chunk_hash(data) == m.chunk_hashes[index]


def held_bytes(m: ChunkedManifest, held: int, has_last: bool) -> int:
    """Payload bytes in ``held`` chunks (``has_last``: the short last chunk is among them)."""
    n = len(m.chunk_hashes)
    short = m.chunk_bytes - (m.total_bytes - (n - 1) * m.chunk_bytes)
    return max(0, min(m.total_bytes, held * m.chunk_bytes - (short if has_last else 0)))


def check_chunk_hashes(m: ChunkedManifest) -> None:
    """Raise :class:`ManifestError` unless ``m`` lists one 32-byte hash per chunk."""
    expected = expected_chunks(m.total_bytes, m.chunk_bytes)
    if len(m.chunk_hashes) != expected:
        raise ManifestError(f"{len(m.chunk_hashes)} chunk hashes for {m.total_bytes} bytes in "
                            f"{m.chunk_bytes}-byte chunks")
    if any(len(h) != HASH_BYTES for h in m.chunk_hashes):
        raise ManifestError("chunk hashes must be 32-byte SHA-256 digests")


# ---------------------------------------------------------------- signing
def _sorted(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _sorted(obj[k]) for k in sorted(obj)}
    if isinstance(obj, list):
        return [_sorted(v) for v in obj]
    return obj


def unsigned_wire(wire: dict[str, Any]) -> dict[str, Any]:
    """A signed message's wire dict without ``signature``, map keys sorted at every level."""
    return _sorted({k: v for k, v in wire.items() if k != "signature"})


def unsigned_form(msg: Any) -> dict[str, Any]:
    """:func:`unsigned_wire` of a message."""
    return unsigned_wire(msg.to_wire())


def signing_payload(msg: Any, domain: bytes) -> bytes:
    """What the learner signs of a message: ``domain``, then :func:`unsigned_form` as msgpack."""
    return domain + msgpack.packb(unsigned_form(msg), use_bin_type=True)


def content_id(msg: Any, domain: bytes) -> bytes:
    """The content id of a signed manifest: SHA-256 of its signing payload."""
    return hashlib.sha256(signing_payload(msg, domain)).digest()


def sign(msg: Any, domain: bytes, private_key: Any) -> Any:
    """Sign ``msg`` in place with a libp2p ``PrivateKey`` (the learner host's identity key)."""
    msg.signature = private_key.sign(signing_payload(msg, domain))
    return msg


def public_key_of(peer_id: str) -> Any:
    from libp2p.peer.id import ID  # libp2p loads late: manifests are also built offline

    try:
        key = ID.from_base58(peer_id).extract_public_key()
    except Exception as e:
        raise ManifestError(f"bad signer peer id {peer_id!r}: {e}") from e
    if key is None:
        raise ManifestError(f"peer id {peer_id} does not embed its public key")
    return key


def check_signature(signer: str, signature: bytes, payload: bytes, learner_peer_id: str, what: str) -> None:
    """Raise :class:`ManifestError` unless ``signature`` over ``payload`` (a message's signing
    payload) is ``learner_peer_id``'s Ed25519 signature and ``signer`` names it. ``what``
    names the message in the error."""
    if signer != learner_peer_id:
        raise ManifestError(f"{what} is signed by {signer}, not the learner {learner_peer_id}")
    if not signature:
        raise ManifestError(f"{what} is unsigned")
    try:
        ok = public_key_of(learner_peer_id).verify(payload, signature)
    except ManifestError:
        raise
    except Exception as e:
        raise ManifestError(f"{what}: signature check failed: {e}") from e
    if not ok:
        raise ManifestError(f"{what}: bad signature")


def verify_signed(msg: Any, domain: bytes, learner_peer_id: str, what: str) -> None:
    """:func:`check_signature` of a message carrying ``signer`` and ``signature`` fields."""
    check_signature(msg.signer, msg.signature, signing_payload(msg, domain), learner_peer_id, what)
