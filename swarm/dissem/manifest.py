"""Manifests: build, chunk, sign and verify an adapter version.

The signature covers :func:`canonical_bytes`: a domain tag followed by msgpack of the
manifest's wire dict without ``signature``, with map keys sorted at every level, so
signer and verifier serialise the same fields identically whatever order a peer sent
them in. Fields a newer peer adds are dropped by validation before verification, so they
are never covered by a signature an older node checks.

Verification needs nothing but the manifest and the expected learner peer id: Ed25519
peer ids embed the public key (identity multihash), so the key is taken from the peer id
the node was configured with, never from the manifest or from the peer that relayed it.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack

from swarm.dissem.codec import CODECS, CodecConfig, compress, decode_tensors, decompress, encode_tensors
from swarm.proto.dissem import Manifest, TensorSpec

#: Prepended to the signed bytes so a manifest signature can never be replayed as another message's.
SIGNING_DOMAIN = b"echo-swarm/adapter-manifest/1\x00"


class ManifestError(ValueError):
    """A manifest that is forged, altered, inconsistent or for another run."""


def _sorted(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _sorted(obj[k]) for k in sorted(obj)}
    if isinstance(obj, list):
        return [_sorted(v) for v in obj]
    return obj


def signing_payload(msg: Any, domain: bytes) -> bytes:
    """What the learner signs of a message: a domain tag (so a signature of one kind of message
    is never valid for another), then its wire form without ``signature`` as key-sorted msgpack."""
    wire = msg.to_wire()
    wire.pop("signature", None)
    return domain + msgpack.packb(_sorted(wire), use_bin_type=True)


def canonical_bytes(manifest: Manifest) -> bytes:
    return signing_payload(manifest, SIGNING_DOMAIN)


def chunk_payload(data: bytes, chunk_bytes: int) -> list[bytes]:
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    return [data[i: i + chunk_bytes] for i in range(0, len(data), chunk_bytes)] or [b""]


def chunk_hash(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def build_version(
    *, run_id: str, version: int, rank: int, alpha: float, target_modules: list[str],
    tensors: dict, codec: CodecConfig, chunk_bytes: int, signer: str,
    base: dict | None = None, base_version: int = -1,
) -> tuple[Manifest, list[bytes]]:
    """Encode ``tensors`` and return the unsigned manifest and the chunks."""
    specs, raw = encode_tensors(tensors, codec, base if base_version >= 0 else None)
    packed = compress(raw, codec.zstd_level)
    chunks = chunk_payload(packed, chunk_bytes)
    manifest = Manifest(
        run_id=run_id, version=version, base_version=base_version if base is not None else -1,
        codec=codec.codec, block_size=codec.block_size, rank=rank, alpha=float(alpha),
        target_modules=list(target_modules), tensors=[TensorSpec(n, s) for n, s in specs],
        raw_bytes=len(raw), total_bytes=len(packed), chunk_bytes=chunk_bytes,
        chunk_hashes=[chunk_hash(c) for c in chunks], signer=signer,
    )
    return manifest, chunks


def sign_manifest(manifest: Manifest, private_key: Any) -> Manifest:
    """Sign in place with a libp2p ``PrivateKey`` (the learner host's identity key)."""
    manifest.signature = private_key.sign(canonical_bytes(manifest))
    return manifest


def public_key_of(peer_id: str) -> Any:
    from libp2p.peer.id import ID

    try:
        key = ID.from_base58(peer_id).extract_public_key()
    except Exception as e:
        raise ManifestError(f"bad signer peer id {peer_id!r}: {e}") from e
    if key is None:
        raise ManifestError(f"peer id {peer_id} does not embed its public key")
    return key


def check_signature(signer: str, signature: bytes, payload: bytes, learner_peer_id: str, what: str) -> None:
    """Raise :class:`ManifestError` unless ``signature`` over ``payload`` (a message's canonical
    bytes) is ``learner_peer_id``'s Ed25519 signature and ``signer`` names it. ``what``
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


def verify_manifest(manifest: Manifest, learner_peer_id: str, run_id: str | None = None) -> None:
    """Raise :class:`ManifestError` unless ``manifest`` is signed by ``learner_peer_id``,
    belongs to ``run_id`` (when given) and is self-consistent."""
    check_signature(manifest.signer, manifest.signature, canonical_bytes(manifest), learner_peer_id,
                    f"manifest v{manifest.version}")
    if run_id is not None and manifest.run_id != run_id:
        raise ManifestError(f"manifest v{manifest.version} is for run {manifest.run_id}, not {run_id}")
    check_consistent(manifest)


def check_consistent(m: Manifest) -> None:
    if m.codec not in CODECS:
        raise ManifestError(f"unknown codec {m.codec!r}")
    expected = max(1, -(-m.total_bytes // m.chunk_bytes))
    if len(m.chunk_hashes) != expected:
        raise ManifestError(f"{len(m.chunk_hashes)} chunk hashes for {m.total_bytes} bytes in {m.chunk_bytes}-byte chunks")
    if any(len(h) != 32 for h in m.chunk_hashes):
        raise ManifestError("chunk hashes must be 32-byte SHA-256 digests")
    if m.base_version >= m.version:
        raise ManifestError(f"delta base v{m.base_version} is not older than v{m.version}")


def chunk_ok(manifest: Manifest, index: int, data: bytes) -> bool:
    """Whether ``data`` is chunk ``index`` of ``manifest`` (right size and SHA-256)."""
    if not 0 <= index < len(manifest.chunk_hashes):
        return False
    last = len(manifest.chunk_hashes) - 1
    size = manifest.chunk_bytes if index < last else manifest.total_bytes - last * manifest.chunk_bytes
    return len(data) == size and chunk_hash(data) == manifest.chunk_hashes[index]


def decode_version(manifest: Manifest, payload: bytes, base: dict | None = None) -> dict:
    """Tensors of a complete version (``base``: the decoded delta base, when it is a delta).
    Raises :class:`~swarm.dissem.codec.CodecError` if the payload does not decode."""
    raw = decompress(payload, manifest.raw_bytes)
    specs = [(t.name, list(t.shape)) for t in manifest.tensors]
    return decode_tensors(raw, specs, manifest.codec, manifest.block_size,
                          base if manifest.base_version >= 0 else None)
