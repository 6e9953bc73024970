"""The chunk layer's pure parts: chunk geometry, have-maps, stores (memory, files, disk: resumable
and hash-checked), chunk choice, and signing (a tampered manifest is refused)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

import pytest

from swarm.chunks.disk import DiskChunks
from swarm.chunks.manifest import (ManifestError, chunk_hash, chunk_ok, chunk_range, content_id, held_bytes, sign,
                                   split_chunks, verify_signed)
from swarm.chunks.choice import for_anchor, next_batch, pick_chunks
from swarm.chunks.store import FileChunks, MemoryChunks, bitmap, from_bitmap
from swarm.wire import Message

DOMAIN = b"echo-swarm/test-blob/1\x00"


@dataclass
class Blob(Message):
    """A minimal chunked manifest."""

    KIND = "blob"
    total_bytes: int
    chunk_bytes: int
    chunk_hashes: list[bytes] = field(default_factory=list)
    signer: str = ""
    signature: bytes = b""


def blob(data: bytes, chunk: int, signer: str = "") -> tuple[Blob, list[bytes]]:
    chunks = split_chunks(data, chunk)
    return Blob(len(data), chunk, [chunk_hash(c) for c in chunks], signer), chunks


def keypair():
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    kp = create_new_key_pair()
    return kp.private_key, ID.from_pubkey(kp.public_key).to_base58()


# ---------------------------------------------------------------- geometry
def test_chunk_geometry_and_checks():
    data = os.urandom(10_001)
    m, chunks = blob(data, 1000)
    assert len(chunks) == 11 and chunk_range(m, 10) == (10_000, 1) and b"".join(chunks) == data
    assert all(chunk_ok(m, i, c) for i, c in enumerate(chunks))
    assert not chunk_ok(m, 1, chunks[0]) and not chunk_ok(m, 11, chunks[0]) and not chunk_ok(m, 10, chunks[10] + b"x")
    assert held_bytes(m, 11, True) == 10_001 and held_bytes(m, 2, False) == 2000 and held_bytes(m, 2, True) == 1001
    empty, parts = blob(b"", 1000)
    assert parts == [b""] and chunk_ok(empty, 0, b"")


def test_bitmap_round_trip():
    held = {0, 7, 8, 99}
    assert from_bitmap(bitmap(held, 100), 100) == held
    assert from_bitmap(b"\xff", 3) == {0, 1, 2}
    assert len(bitmap(held, 100)) == 13 and from_bitmap(b"", 10) == set()


# ---------------------------------------------------------------- stores
def test_memory_store_keeps_only_the_manifests_bytes():
    m, chunks = blob(os.urandom(5000), 1000)
    store = MemoryChunks(m)
    assert not store.add(0, chunks[1]) and not store.add(0, b"x" * 1000) and store.count() == 0
    for i in (3, 0, 4):
        assert store.add(i, chunks[i])
    assert store.order == [3, 0, 4] and store.missing() == [1, 2]
    assert from_bitmap(store.have_bitmap(), store.n) == {0, 3, 4} and store.read(1) is None
    with pytest.raises(RuntimeError):
        store.payload()
    assert MemoryChunks(m, chunks).payload() == b"".join(chunks)


def test_file_store_reads_across_files(tmp_path):
    a, b = os.urandom(2500), os.urandom(700)
    (tmp_path / "a").write_bytes(a)
    (tmp_path / "b").write_bytes(b)
    m, chunks = blob(a + b, 1000)
    files = FileChunks(m, [(tmp_path / "a", 2500), (tmp_path / "b", 700)])
    assert files.missing() == [] and files.count() == 4 == len(chunks)
    assert [files.read(i) for i in range(4)] == chunks and files.read(4) is None
    with pytest.raises(FileNotFoundError):
        FileChunks(m, [(tmp_path / "a", 2501)])


def test_disk_store_resumes_rechecks_and_starts_over_for_another_manifest(tmp_path):
    data = os.urandom(8000)
    m, chunks = blob(data, 1000)
    d = tmp_path / "store"
    store = DiskChunks(m, d)
    assert not store.add(0, b"garbage") and not store.add(0, chunks[1])
    for i in (0, 2, 4, 6):
        assert store.add(i, chunks[i])
    with open(d / "payload.part", "r+b") as f:  # damaged behind the store's back
        f.seek(2 * 1000)
        f.write(b"\0" * 10)
    again = DiskChunks(m, d)  # a new process
    assert again.held == {0, 4, 6} and again.read(4) == chunks[4] and again.read(2) is None
    for i in again.missing():
        assert again.add(i, chunks[i])
    assert again.payload_path.read_bytes() == data
    other, _ = blob(data, 500)  # another chunking: nothing listed is trusted
    assert DiskChunks(other, d).held == set()


# ---------------------------------------------------------------- chunk choice
def test_pick_chunks_skips_in_flight_and_what_the_peer_lacks():
    missing = [0, 1, 2, 3, 5, 8, 9]
    assert pick_chunks(missing, set(), None, 3) == [0, 1, 2]
    assert pick_chunks(missing, {0, 1}, None, 3) == [2, 3, 5]
    assert pick_chunks(missing, set(), {3, 8, 40}, 3) == [3, 8]
    assert pick_chunks(missing, set(), None, 3, start=6) == [8, 9, 0]  # wraps around
    assert pick_chunks(missing, set(), set(), 3) == [] and pick_chunks(missing, set(), None, 0) == []


def test_the_anchor_asked_last_gets_only_what_no_holder_has():
    assert for_anchor([0, 1, 2, 3, 4], [{0, 1}, {3}]) == [2, 4]
    assert for_anchor([0, 1], []) == [0, 1] and for_anchor([0, 1], [set(), {0, 1}]) == []


def test_batch_follows_the_peers_rate():
    mib = 1 << 20
    assert next_batch(0.0, mib, 3.0, 8) == 1  # nothing measured yet
    assert next_batch(0.3e6, mib, 3.0, 8) == 1  # a slow, shared link: one chunk a request
    assert next_batch(2 * mib, mib, 3.0, 8) == 6
    assert next_batch(100e6, mib, 3.0, 8) == 8  # fast: capped
    # a long link: at least 20 round trips' worth, past the cap (6.25 MB/s at 200 ms: 23 chunks)
    assert next_batch(6.25e6, mib, 3.0, 8, rtt_s=0.2) == 23
    assert next_batch(6.25e6, mib, 3.0, 8, rtt_s=0.01) == 8  # a LAN: the cap as before
    assert next_batch(0.0, mib, 3.0, 8, rtt_s=0.2) == 1


# ---------------------------------------------------------------- signing
def test_a_tampered_or_foreign_manifest_is_refused():
    key, pid = keypair()
    other_key, other_pid = keypair()
    m, _ = blob(os.urandom(3000), 1000, signer=pid)
    cid = content_id(m, DOMAIN)
    sign(m, DOMAIN, key)
    assert content_id(m, DOMAIN) == cid != content_id(m, b"another-domain\x00")  # the signature is not covered
    verify_signed(Blob.from_wire(dict(reversed(list(m.to_wire().items())))), DOMAIN, pid, "blob")
    tampered = dataclasses.replace(m, chunk_hashes=[bytes(32)] + m.chunk_hashes[1:])
    assert content_id(tampered, DOMAIN) != cid
    with pytest.raises(ManifestError, match="bad signature"):
        verify_signed(tampered, DOMAIN, pid, "blob")
    with pytest.raises(ManifestError, match="bad signature"):  # right key, another kind of message
        verify_signed(m, b"echo-swarm/other/1\x00", pid, "blob")
    with pytest.raises(ManifestError, match="bad signature"):  # claims the learner, signed by someone else
        verify_signed(sign(dataclasses.replace(m), DOMAIN, other_key), DOMAIN, pid, "blob")
    with pytest.raises(ManifestError, match="not the learner"):
        verify_signed(m, DOMAIN, other_pid, "blob")
    with pytest.raises(ManifestError, match="unsigned"):
        verify_signed(dataclasses.replace(m, signature=b""), DOMAIN, pid, "blob")
