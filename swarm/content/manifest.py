"""The model manifest: build it from a model on disk, sign it, verify it.

Signing, chunk geometry and chunk checks are the chunk layer's (``swarm.chunks.manifest``),
under this module's domain tag, so an adapter manifest's signature is never valid for a model
manifest. The learner's public key comes from its peer id, never from the manifest.

Building reads every byte once (chunk hashes and file hashes in one pass); the unsigned
result is cached under ``<cache>/manifests/`` keyed by the files' paths, sizes, mtimes and
the chunk size, so a learner restart does not read a large model again.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import msgpack

from swarm.chunks.manifest import (ManifestError, check_chunk_hashes, chunk_hash, content_id, sign, signing_payload,
                                   verify_signed)
from swarm.content.model_id import ModelFileRef, content_sha256_of, model_files
from swarm.proto.model import ModelFile, ModelManifest
from swarm.wire import WireError

#: Prepended to the signed bytes.
SIGNING_DOMAIN = b"echo-swarm/model-manifest/1\x00"
#: Default chunk size of a model transfer.
DEFAULT_CHUNK_BYTES = 1024 * 1024
KINDS = ("gguf", "hf")

__all__ = ["DEFAULT_CHUNK_BYTES", "ManifestError", "build_model_manifest", "canonical_bytes", "model_content_id",
           "sign_model_manifest", "verify_model_manifest"]


def canonical_bytes(m: ModelManifest) -> bytes:
    return signing_payload(m, SIGNING_DOMAIN)


def model_content_id(m: ModelManifest) -> bytes:
    """The content id its chunks are requested by (``swarm.chunks``)."""
    return content_id(m, SIGNING_DOMAIN)


def _cache_file(cache_dir: Path, files: list[tuple[str, Path]], chunk_bytes: int) -> Path:
    parts = [str(chunk_bytes)]
    for rel, full in files:
        st = full.stat()
        parts += [rel, str(full), str(st.st_size), str(st.st_mtime_ns)]
    key = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]
    return Path(cache_dir) / "manifests" / f"{key}.msgpack"


def build_model_manifest(path: Path, *, name: str, signer: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                         cache_dir: Path | None = None) -> ModelManifest:
    """The unsigned manifest of the model (GGUF file or HF directory) at ``path``."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    path = Path(path)
    files = model_files(path)
    kind = "hf" if path.is_dir() else "gguf"
    cached = _cache_file(cache_dir, files, chunk_bytes) if cache_dir else None
    if cached is not None and cached.is_file():
        try:
            m = ModelManifest.from_wire(msgpack.unpackb(cached.read_bytes(), raw=False))
            m.name, m.signer, m.signature = name, signer, b""
            return m
        except (ValueError, WireError, msgpack.UnpackException):
            pass  # rebuild
    refs: list[ModelFileRef] = []
    hashes: list[bytes] = []
    buf = bytearray()
    for rel, full in files:
        h = hashlib.sha256()
        size = 0
        with open(full, "rb") as f:
            while block := f.read(chunk_bytes):
                h.update(block)
                size += len(block)
                buf += block
                while len(buf) >= chunk_bytes:
                    hashes.append(chunk_hash(bytes(buf[:chunk_bytes])))
                    del buf[:chunk_bytes]
        refs.append(ModelFileRef(rel, size, h.hexdigest()))
    if buf or not hashes:
        hashes.append(chunk_hash(bytes(buf)))
    m = ModelManifest(
        content_sha256=content_sha256_of(refs, kind == "hf"), name=name, kind=kind,
        files=[ModelFile(r.relpath, r.size, r.sha256) for r in refs], total_bytes=sum(r.size for r in refs),
        chunk_bytes=chunk_bytes, chunk_hashes=hashes, signer=signer,
    )
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(msgpack.packb(m.to_wire(), use_bin_type=True))
        os.replace(tmp, cached)
    return m


def sign_model_manifest(m: ModelManifest, private_key: Any) -> ModelManifest:
    """Sign in place with a libp2p ``PrivateKey`` (the learner host's identity key)."""
    return sign(m, SIGNING_DOMAIN, private_key)


def verify_model_manifest(m: ModelManifest, learner_peer_id: str, content_sha256: str | None = None) -> None:
    """Raise :class:`ManifestError` unless ``m`` is signed by ``learner_peer_id``, is
    self-consistent and (when given) describes the model ``content_sha256``."""
    tag = f"model manifest {m.content_sha256[:12]}"
    verify_signed(m, SIGNING_DOMAIN, learner_peer_id, tag)
    if content_sha256 is not None and m.content_sha256 != content_sha256:
        raise ManifestError(f"{tag} is not the model {content_sha256[:12]} that was asked for")
    check_consistent(m)


def check_consistent(m: ModelManifest) -> None:
    if m.kind not in KINDS:
        raise ManifestError(f"unknown model kind {m.kind!r} (known: {', '.join(KINDS)})")
    if not m.files or (m.kind == "gguf" and len(m.files) != 1):
        raise ManifestError(f"a {m.kind} model with {len(m.files)} files")
    rels = [f.relpath for f in m.files]
    if rels != sorted(set(rels)):
        raise ManifestError("model files must be unique and sorted by path")
    for rel in rels:
        p = Path(rel)
        if p.is_absolute() or ".." in p.parts or rel.startswith(".") or "\\" in rel or not rel:
            raise ManifestError(f"unsafe file path in manifest: {rel!r}")
    if sum(f.size for f in m.files) != m.total_bytes:
        raise ManifestError("file sizes do not add up to total_bytes")
    check_chunk_hashes(m)
    refs = [ModelFileRef(f.relpath, f.size, f.sha256) for f in m.files]
    if content_sha256_of(refs, m.kind == "hf") != m.content_sha256:
        raise ManifestError("the content hash does not match the files' hashes")

