"""Manifests: canonical bytes, signatures against the learner's peer id, chunk checks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from swarm.chunks.manifest import chunk_ok
from swarm.dissem.codec import CodecConfig
from swarm.dissem.manifest import (
    ManifestError, build_version, canonical_bytes, decode_version, sign_manifest, verify_manifest,
)
from swarm.proto.dissem import Manifest


def keypair():
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    kp = create_new_key_pair()
    return kp, ID.from_pubkey(kp.public_key).to_base58()


def make(signer: str, codec="int8", chunk=1000):
    rng = np.random.default_rng(0)
    tensors = {"a.lora_A.weight": rng.standard_normal((8, 300)).astype(np.float32),
               "a.lora_B.weight": rng.standard_normal((300, 8)).astype(np.float32) * 0.01}
    m, chunks = build_version(run_id="r1", version=3, rank=8, alpha=16.0, target_modules=["q_proj"],
                              tensors=tensors, codec=CodecConfig(codec), chunk_bytes=chunk, signer=signer)
    return m, chunks, tensors


def test_signed_manifest_verifies_and_survives_the_wire():
    kp, pid = keypair()
    m, chunks, tensors = make(pid)
    sign_manifest(m, kp.private_key)
    wire = m.to_wire()
    again = Manifest.from_wire(dict(reversed(list(wire.items()))))  # field order does not matter
    verify_manifest(again, pid, "r1")
    assert all(chunk_ok(m, i, c) for i, c in enumerate(chunks)) and len(chunks) == len(m.chunk_hashes) > 1
    out = decode_version(m, b"".join(chunks))
    assert np.abs(out["a.lora_A.weight"] - tensors["a.lora_A.weight"]).max() < 0.05


@pytest.mark.parametrize("change", [
    {"version": 4}, {"alpha": 32.0}, {"codec": "fp16"}, {"run_id": "r2"}, {"target_modules": ["v_proj"]},
    {"chunk_hashes": "swap"}, {"total_bytes": "plus1"},
])
def test_any_altered_field_breaks_the_signature(change):
    kp, pid = keypair()
    m, _, _ = make(pid)
    sign_manifest(m, kp.private_key)
    key, value = next(iter(change.items()))
    if value == "swap":
        value = list(reversed(m.chunk_hashes))
    elif value == "plus1":
        value = m.total_bytes + 1
    forged = dataclasses.replace(m, **{key: value})
    with pytest.raises(ManifestError, match="signature"):
        verify_manifest(forged, pid)


def test_forged_signer_wrong_run_and_unsigned_rejected():
    kp, pid = keypair()
    attacker, attacker_pid = keypair()
    m, _, _ = make(pid)
    with pytest.raises(ManifestError, match="unsigned"):
        verify_manifest(m, pid)
    # Signed by someone else but claiming to be the learner.
    sign_manifest(m, attacker.private_key)
    with pytest.raises(ManifestError, match="bad signature"):
        verify_manifest(m, pid)
    # Honestly signed by the attacker: the signer is not the learner.
    m2, _, _ = make(attacker_pid)
    sign_manifest(m2, attacker.private_key)
    with pytest.raises(ManifestError, match="not the learner"):
        verify_manifest(m2, pid)
    m3, _, _ = make(pid)
    sign_manifest(m3, kp.private_key)
    with pytest.raises(ManifestError, match="run"):
        verify_manifest(m3, pid, run_id="other-run")
    assert canonical_bytes(m3) != canonical_bytes(m2)


def test_tampered_or_misplaced_chunks_fail_the_check():
    _, pid = keypair()
    m, chunks, _ = make(pid)
    bad = bytearray(chunks[0])
    bad[10] ^= 1
    assert not chunk_ok(m, 0, bytes(bad))
    assert not chunk_ok(m, 1, chunks[0])
    assert not chunk_ok(m, len(chunks), chunks[0])
    assert not chunk_ok(m, len(chunks) - 1, chunks[-1] + b"x")
