"""Manifests: build, chunk, sign and verify an adapter version.

The signature covers :func:`canonical_bytes`: a domain tag followed by msgpack of the
manifest's wire dict without ``signature``, with map keys sorted at every level, so
signer and verifier serialise the same fields identically whatever order a peer sent
them in. Fields a newer peer adds are dropped by validation before verification, so they
are never covered by a signature an older node checks.

Verification needs nothing but the manifest and the expected learner peer id: Ed25519
peer ids embed the public key (identity multihash), so the key is taken from the peer id
the node was configured with, never from the manifest or from the peer that relayed it.

Layer ranges: besides the whole adapter, the learner may publish, per version, one manifest
per pipeline-stage layer range ``[start, end)`` holding only those layers' tensors. The range
is a signed field (``layers``), so a slice cannot be relabelled as another range's, and
:func:`check_consistent` refuses a range manifest naming a tensor outside its range. A
version's manifests are told apart by ``(version, layer range)``, :func:`content_key`.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack

from swarm.dissem.codec import CODECS, CodecConfig, compress, decode_tensors, decompress, encode_tensors
from swarm.pipeline.layers import layer_index
from swarm.proto.dissem import MAX_LAYER, Manifest, TensorSpec

#: A half-open decoder-layer range ``(start, end)``; ``None`` stands for the whole adapter.
LayerRange = tuple[int, int] | None

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


def range_of(layers: list[int]) -> LayerRange:
    """A wire ``layers`` field (``[]`` or ``[start, end]``) as a :data:`LayerRange`."""
    return (int(layers[0]), int(layers[1])) if layers else None


def layers_of(rng: LayerRange) -> list[int]:
    """The wire ``layers`` field of a :data:`LayerRange`."""
    return [rng[0], rng[1]] if rng is not None else []


def describe(rng: LayerRange) -> str:
    return "the whole adapter" if rng is None else f"layers [{rng[0]}, {rng[1]})"


def normalise_ranges(ranges) -> list[tuple[int, int]]:
    """``ranges`` as sorted, distinct ``(start, end)`` pairs; raises ``ValueError`` unless every
    one is a non-empty half-open range of whole layer numbers, ``0 <= start < end <= MAX_LAYER``.
    Ranges may overlap (pipelines split the layers differently)."""
    out = set()
    for r in ranges:
        try:
            start, end = r
        except (TypeError, ValueError):
            raise ValueError(f"a layer range is a (start, end) pair, got {r!r}") from None
        if isinstance(start, bool) or isinstance(end, bool) or not isinstance(start, int) \
                or not isinstance(end, int) or not 0 <= start < end <= MAX_LAYER:
            raise ValueError(f"bad layer range {r!r}: need whole numbers 0 <= start < end <= {MAX_LAYER}")
        out.add((start, end))
    return sorted(out)


def content_key(manifest: Manifest) -> tuple[int, LayerRange]:
    """What tells a version's manifests apart: ``(version, layer range)``."""
    return manifest.version, range_of(manifest.layers)


def chunk_payload(data: bytes, chunk_bytes: int) -> list[bytes]:
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    return [data[i: i + chunk_bytes] for i in range(0, len(data), chunk_bytes)] or [b""]


def chunk_hash(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def build_version(
    *, run_id: str, version: int, rank: int, alpha: float, target_modules: list[str],
    tensors: dict, codec: CodecConfig, chunk_bytes: int, signer: str,
    base: dict | None = None, base_version: int = -1, layers: LayerRange = None,
) -> tuple[Manifest, list[bytes]]:
    """Encode ``tensors`` and return the unsigned manifest and the chunks. ``layers``: the
    manifest covers that layer range only (``tensors`` must hold nothing else)."""
    specs, raw = encode_tensors(tensors, codec, base if base_version >= 0 else None)
    packed = compress(raw, codec.zstd_level)
    chunks = chunk_payload(packed, chunk_bytes)
    manifest = Manifest(
        run_id=run_id, version=version, base_version=base_version if base is not None else -1,
        codec=codec.codec, block_size=codec.block_size, rank=rank, alpha=float(alpha),
        target_modules=list(target_modules), tensors=[TensorSpec(n, s) for n, s in specs],
        raw_bytes=len(raw), total_bytes=len(packed), chunk_bytes=chunk_bytes,
        chunk_hashes=[chunk_hash(c) for c in chunks], signer=signer, layers=layers_of(layers),
    )
    check_consistent(manifest)
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
    rng = range_of(m.layers)
    if rng is not None:
        for t in m.tensors:
            i = layer_index(t.name)
            if i is None or not rng[0] <= i < rng[1]:
                raise ManifestError(f"manifest v{m.version} of {describe(rng)} holds tensor {t.name}, "
                                    f"which is outside that range")


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
