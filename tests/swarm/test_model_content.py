"""Model identity, signed model manifests and the model's resumable on-disk copy (swarm.content).
The chunk layer's own pieces (have-maps, chunk choice) are tested in ``tests/swarm/chunks``."""

from __future__ import annotations

import hashlib
import os

import pytest

from swarm.chunks.manifest import chunk_ok
from swarm.content import model_id
from swarm.content.manifest import ManifestError, build_model_manifest, sign_model_manifest, verify_model_manifest
from swarm.content.model_id import EXCLUDED_NAMES, content_sha256, describe
from swarm.content.store import ModelCopy, cached_model
from swarm.host import load_or_create_identity
from swarm.proto.model import ModelManifest


def write(path, data: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.fixture
def hf_dir(tmp_path):
    d = tmp_path / "hf"
    write(d / "config.json", b'{"model_type": "llama"}')
    write(d / "model.safetensors", os.urandom(300_000))
    write(d / "sub" / "tokenizer.json", b"{}" * 1000)
    write(d / ".hidden" / "junk", b"x")
    write(d / ".DS_Store", b"x")
    write(d / next(iter(EXCLUDED_NAMES)), b"{}")
    return d


@pytest.fixture
def key(tmp_path):
    kp = load_or_create_identity(tmp_path / "key")
    from libp2p.peer.id import ID

    return kp.private_key, ID.from_pubkey(kp.public_key).to_base58()


# ---------------------------------------------------------------- identity
def test_file_hash_is_sha256_of_bytes_and_independent_of_path(tmp_path):
    data = os.urandom(50_000)
    a, b = write(tmp_path / "a.gguf", data), write(tmp_path / "x" / "b.gguf", data)
    assert content_sha256(a) == content_sha256(b) == hashlib.sha256(data).hexdigest()
    c = write(tmp_path / "c.gguf", data[:-1] + bytes([data[-1] ^ 1]))
    assert content_sha256(c) != content_sha256(a)


def test_directory_hash_is_the_sorted_sha256sum_listing(hf_dir):
    lines = "".join(f"{hashlib.sha256((hf_dir / rel).read_bytes()).hexdigest()}  {rel}\n"
                    for rel in sorted(["config.json", "model.safetensors", "sub/tokenizer.json"]))
    assert content_sha256(hf_dir) == hashlib.sha256(lines.encode()).hexdigest()
    sha, files = describe(hf_dir)
    assert [f.relpath for f in files] == ["config.json", "model.safetensors", "sub/tokenizer.json"]
    (hf_dir / "config.json").write_bytes(b'{"model_type": "qwen2"}')
    assert content_sha256(hf_dir) != sha


def test_hash_cache_skips_rehashing_until_the_file_changes(tmp_path, monkeypatch):
    f = write(tmp_path / "m.gguf", os.urandom(10_000))
    calls = []
    real = model_id.file_sha256
    monkeypatch.setattr(model_id, "file_sha256", lambda p: calls.append(p) or real(p))
    cache = tmp_path / "cache"
    first = content_sha256(f, cache)
    assert content_sha256(f, cache) == first and len(calls) == 1
    f.write_bytes(os.urandom(10_000))  # new content, size the same, mtime changes
    os.utime(f, ns=(1, 10**18))
    assert content_sha256(f, cache) != first and len(calls) == 2


# ---------------------------------------------------------------- manifests
def test_manifest_signs_verifies_and_detects_tampering(hf_dir, key, tmp_path):
    priv, peer = key
    m = build_model_manifest(hf_dir, name="hf", signer=peer, chunk_bytes=64 * 1024)
    assert m.kind == "hf" and m.content_sha256 == content_sha256(hf_dir)
    assert len(m.chunk_hashes) == -(-m.total_bytes // m.chunk_bytes)
    sign_model_manifest(m, priv)
    verify_model_manifest(m, peer, m.content_sha256)
    wire = m.to_wire()
    for mutate in (
        lambda w: w["chunk_hashes"].__setitem__(1, bytes(32)),
        lambda w: w.__setitem__("name", "other"),
        lambda w: w["files"][0].__setitem__("size", w["files"][0]["size"] + 1),
    ):
        w = ModelManifest.from_wire(wire).to_wire()
        mutate(w)
        with pytest.raises(ManifestError):
            verify_model_manifest(ModelManifest.from_wire(w), peer)
    other_priv = load_or_create_identity(tmp_path / "k2").private_key
    forged = ModelManifest.from_wire(wire)
    sign_model_manifest(forged, other_priv)  # signed by someone else, claiming the learner
    with pytest.raises(ManifestError, match="bad signature"):
        verify_model_manifest(forged, peer)
    with pytest.raises(ManifestError, match="not the learner"):
        verify_model_manifest(ModelManifest.from_wire(wire), "12D3KooWSomeoneElse")
    with pytest.raises(ManifestError, match="asked for"):
        verify_model_manifest(ModelManifest.from_wire(wire), peer, "0" * 64)


def test_manifest_rejects_unsafe_paths_and_a_wrong_content_hash(hf_dir, key):
    priv, peer = key
    m = build_model_manifest(hf_dir, name="hf", signer=peer, chunk_bytes=64 * 1024)
    bad = ModelManifest.from_wire(m.to_wire())
    bad.files[0].relpath = "../evil"
    with pytest.raises(ManifestError, match="unsafe|sorted"):
        verify_model_manifest(sign_model_manifest(bad, priv), peer)
    bad = ModelManifest.from_wire(m.to_wire())
    bad.content_sha256 = "1" * 64
    with pytest.raises(ManifestError, match="content hash"):
        verify_model_manifest(sign_model_manifest(bad, priv), peer)


def test_manifest_is_cached_per_path_size_mtime(tmp_path, monkeypatch):
    f = write(tmp_path / "m.gguf", os.urandom(200_000))
    cache = tmp_path / "cache"
    m1 = build_model_manifest(f, name="m", signer="p", chunk_bytes=65536, cache_dir=cache)
    import swarm.content.manifest as mod

    monkeypatch.setattr(mod, "chunk_hash", lambda data: pytest.fail("re-hashed a cached model"))
    m2 = build_model_manifest(f, name="m2", signer="q", chunk_bytes=65536, cache_dir=cache)
    assert m2.chunk_hashes == m1.chunk_hashes and (m2.name, m2.signer) == ("m2", "q")


# ---------------------------------------------------------------- store
def test_store_rejects_bad_chunks_resumes_after_a_kill_and_finishes(hf_dir, tmp_path):
    m = build_model_manifest(hf_dir, name="hf", signer="p", chunk_bytes=32 * 1024)
    src = ModelCopy(m, source=hf_dir)
    assert src.complete and src.read(0) is not None
    d = tmp_path / "store" / m.content_sha256
    copy = ModelCopy(m, d)
    assert not copy.add(0, b"garbage") and not copy.add(0, src.read(1))
    half = range(0, copy.n, 2)
    for i in half:
        assert copy.add(i, src.read(i))
    # a "killed" process: reopen from disk; one listed chunk was damaged meanwhile
    with open(d / "payload.part", "r+b") as f:
        f.seek(2 * m.chunk_bytes)
        f.write(b"\0" * 10)
    again = ModelCopy(m, d)
    assert again.held == set(half) - {2}
    assert again.missing() == sorted(set(range(copy.n)) - set(half) | {2})
    for i in again.missing():
        again.add(i, src.read(i))
    out = again.finish()
    assert content_sha256(out) == m.content_sha256
    assert (out / "sub" / "tokenizer.json").read_bytes() == (hf_dir / "sub" / "tokenizer.json").read_bytes()
    assert cached_model(tmp_path / "store", m.content_sha256) == out
    reopened = ModelCopy(m, d)
    assert reopened.complete and reopened.read(copy.n - 1) == src.read(copy.n - 1)


def test_single_file_model_finishes_as_the_file(tmp_path):
    f = write(tmp_path / "src" / "tiny.gguf", os.urandom(100_001))
    m = build_model_manifest(f, name="tiny", signer="p", chunk_bytes=10_000)
    src, copy = ModelCopy(m, source=f), ModelCopy(m, tmp_path / "store" / m.content_sha256)
    for i in range(copy.n):
        assert chunk_ok(m, i, src.read(i)) and copy.add(i, src.read(i))
    out = copy.finish()
    assert out.name == "tiny.gguf" and out.read_bytes() == f.read_bytes()
