"""Encoding and signing each adapter version for the dissemination service (:mod:`learner.dissem`).

:meth:`AdapterEncoder.encode_all` is CPU work (run it in a worker thread): it encodes the whole
adapter with the configured codec, optionally as a delta to the previous version *as the nodes
decode it*, signs its manifest with the learner host's key, and does the same for the slice of
every registered layer range (a range's slice is a delta only when the previous version had a
manifest for that range too). :meth:`AdapterEncoder.commit` (on the trio thread) then makes the
version the base of the next delta. The codecs work per tensor, so a slice decodes bit-identically
to the same tensors of the whole version, delta versions included.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.lora import LoraAdapter
from learner.config import DissemConfig
from swarm.dissem.codec import CodecConfig
from swarm.dissem.delta_rule import encode_best
from swarm.dissem.manifest import Manifest, build_version, decode_version, sign_manifest
from swarm.pipeline.layers import slice_for_range

if TYPE_CHECKING:
    from swarm.host_identity import PrivateKey

Tensors = dict  # tensor name -> array (numpy or torch), as ``LoraAdapter.tensors``


@dataclass(frozen=True)
class EncodedVersion:
    """One version, encoded and signed."""

    manifest: Manifest
    chunks: list[bytes]
    #: The tensors as every node decodes them (served to direct fetches; the next delta's base).
    recon: Tensors
    #: Layer range -> the manifest and chunks of its slice.
    parts: dict[tuple[int, int], tuple[Manifest, list[bytes]]]


class AdapterEncoder:
    def __init__(self, run_id: str, signer: str, private_key: Callable[[], PrivateKey], cfg: DissemConfig) -> None:
        self.run_id = run_id
        self.signer = signer
        self.private_key = private_key
        self.cfg = cfg
        self.codec = CodecConfig(cfg.codec, cfg.int8_block, cfg.zstd_level)
        #: The codec of delta versions (``dissem.delta_codec``).
        self.delta_codec = CodecConfig(cfg.delta_codec, cfg.delta_block, cfg.zstd_level)
        #: The last version committed, as the nodes decode it (the next delta's base).
        self._recon: tuple[int, Tensors] | None = None
        #: Layer range -> the newest version committed with a manifest for it.
        self._range_published: dict[tuple[int, int], int] = {}

    def _build(self, adapter: LoraAdapter, tensors: Tensors, codec: CodecConfig, base: tuple[int, Tensors] | None,
               layers: tuple[int, int] | None = None) -> tuple[Manifest, list[bytes]]:
        return build_version(
            run_id=self.run_id, version=adapter.version, rank=adapter.rank, alpha=adapter.alpha,
            target_modules=list(adapter.target_modules), tensors=tensors, codec=codec,
            chunk_bytes=self.cfg.chunk_bytes, signer=self.signer,
            base=base[1] if base else None, base_version=base[0] if base else -1, layers=layers,
        )

    def encode(self, adapter: LoraAdapter) -> tuple[Manifest, list[bytes], Tensors]:
        """Encode and sign the whole adapter, whole or as the delta to the previous version as the
        nodes decoded it, as ``dissem.delta`` decides on the measured sizes
        (``swarm.dissem.delta_rule``); also returns the tensors as nodes decode them."""
        base = self._recon if self._recon is not None and self._recon[0] < adapter.version else None
        manifest, chunks = encode_best(lambda codec, b: self._build(adapter, adapter.tensors, codec, b),
                                       self.codec, self.delta_codec, base, self.cfg.delta, adapter.tensors)
        sign_manifest(manifest, self.private_key())
        delta = manifest.base_version >= 0
        recon = decode_version(manifest, b"".join(chunks), base[1] if delta and base else None)
        return manifest, chunks, recon

    def encode_range(self, adapter: LoraAdapter, rng: tuple[int, int], delta: bool) -> tuple[Manifest, list[bytes]]:
        """Encode and sign the manifest of ``rng``'s slice of ``adapter``, as the whole version
        was (``delta``: as a delta, when that version had a manifest for ``rng`` too; the codecs
        work per tensor, so the slice decodes to exactly the whole version's tensors)."""
        base = None
        if delta and self._recon is not None and self._range_published.get(rng) == self._recon[0]:
            base = (self._recon[0], slice_for_range(self._recon[1], *rng))
        manifest, chunks = self._build(adapter, slice_for_range(adapter.tensors, *rng),
                                       self.delta_codec if base else self.codec, base, rng)
        return sign_manifest(manifest, self.private_key()), chunks

    def encode_all(self, adapter: LoraAdapter, ranges: list[tuple[int, int]]) -> EncodedVersion:
        """The whole adapter and each range's slice, encoded alike (CPU work: run it in a thread)."""
        manifest, chunks, recon = self.encode(adapter)
        delta = manifest.base_version >= 0
        return EncodedVersion(manifest, chunks, recon, {r: self.encode_range(adapter, r, delta) for r in ranges})

    def with_settings(self, cfg: DissemConfig) -> "AdapterEncoder":
        """An encoder of ``cfg`` that keeps this one's last committed version as the next delta's
        base (the nodes still hold it, however the next versions are encoded)."""
        other = AdapterEncoder(self.run_id, self.signer, self.private_key, cfg)
        other._recon, other._range_published = self._recon, dict(self._range_published)
        return other

    def commit(self, version: int, encoded: EncodedVersion) -> None:
        """``encoded`` was published: it is the base of the next delta, for its ranges too."""
        self._recon = (version, encoded.recon)
        for rng in encoded.parts:
            self._range_published[rng] = version
