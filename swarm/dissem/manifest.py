"""Adapter manifests: build, chunk, sign and verify an adapter version.

Signing, chunk geometry and chunk checks are the chunk layer's (``swarm.chunks.manifest``):
the signature covers :func:`canonical_bytes`, this module's domain tag followed by the
manifest's key-sorted wire form without ``signature``. Fields a newer peer adds are dropped by
validation before verification, so they are never covered by a signature an older node checks.
Verification needs nothing but the manifest and the expected learner peer id (Ed25519 peer ids
embed the public key), never a key from the manifest or from the peer that relayed it.

Layer ranges: besides the whole adapter, the learner may publish, per version, one manifest
per pipeline-stage layer range ``[start, end)`` holding only those layers' tensors. The range
is a signed field (``layers``), so a slice cannot be relabelled as another range's, and
:func:`check_consistent` refuses a range manifest naming a tensor outside its range. A
version's manifests are told apart by ``(version, layer range)``, :func:`content_key`.
"""

from __future__ import annotations

from typing import Any

from swarm.chunks.manifest import (ManifestError, check_chunk_hashes, chunk_hash, content_id, sign, signing_payload,
                                   split_chunks, verify_signed)
from swarm.dissem.codec import CODECS, CodecConfig, compress, decode_tensors, decompress, encode_tensors
from swarm.pipeline.layers import layer_index
from swarm.proto.dissem import MAX_LAYER, Manifest, TensorSpec

#: A half-open decoder-layer range ``(start, end)``; ``None`` stands for the whole adapter.
LayerRange = tuple[int, int] | None

#: Prepended to the signed bytes so a manifest signature can never be replayed as another message's.
SIGNING_DOMAIN = b"echo-swarm/adapter-manifest/1\x00"


def canonical_bytes(manifest: Manifest) -> bytes:
    return signing_payload(manifest, SIGNING_DOMAIN)


def adapter_content_id(manifest: Manifest) -> bytes:
    """The content id its chunks are requested by (``swarm.chunks``)."""
    return content_id(manifest, SIGNING_DOMAIN)


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


def build_version(
    *, run_id: str, version: int, rank: int, alpha: float, target_modules: list[str],
    tensors: dict, codec: CodecConfig, chunk_bytes: int, signer: str,
    base: dict | None = None, base_version: int = -1, layers: LayerRange = None,
) -> tuple[Manifest, list[bytes]]:
    """Encode ``tensors`` and return the unsigned manifest and the chunks. ``layers``: the
    manifest covers that layer range only (``tensors`` must hold nothing else)."""
    specs, raw = encode_tensors(tensors, codec, base if base_version >= 0 else None)
    packed = compress(raw, codec.zstd_level)
    chunks = split_chunks(packed, chunk_bytes)
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
    return sign(manifest, SIGNING_DOMAIN, private_key)


def verify_manifest(manifest: Manifest, learner_peer_id: str, run_id: str | None = None) -> None:
    """Raise :class:`ManifestError` unless ``manifest`` is signed by ``learner_peer_id``,
    belongs to ``run_id`` (when given) and is self-consistent."""
    verify_signed(manifest, SIGNING_DOMAIN, learner_peer_id, f"manifest v{manifest.version}")
    if run_id is not None and manifest.run_id != run_id:
        raise ManifestError(f"manifest v{manifest.version} is for run {manifest.run_id}, not {run_id}")
    check_consistent(manifest)


def check_consistent(m: Manifest) -> None:
    if m.codec not in CODECS:
        raise ManifestError(f"unknown codec {m.codec!r}")
    check_chunk_hashes(m)
    if m.base_version >= m.version:
        raise ManifestError(f"delta base v{m.base_version} is not older than v{m.version}")
    rng = range_of(m.layers)
    if rng is not None:
        for t in m.tensors:
            i = layer_index(t.name)
            if i is None or not rng[0] <= i < rng[1]:
                raise ManifestError(f"manifest v{m.version} of {describe(rng)} holds tensor {t.name}, "
                                    f"which is outside that range")


def decode_version(manifest: Manifest, payload: bytes, base: dict | None = None) -> dict:
    """Tensors of a complete version (``base``: the decoded delta base, when it is a delta).
    Raises :class:`~swarm.dissem.codec.CodecError` if the payload does not decode."""
    raw = decompress(payload, manifest.raw_bytes)
    specs = [(t.name, list(t.shape)) for t in manifest.tensors]
    return decode_tensors(raw, specs, manifest.codec, manifest.block_size,
                          base if manifest.base_version >= 0 else None)
