"""Chunks of adapter versions held by one peer (a node, or the learner that made them).

An :class:`Assembly` gathers one version's chunks: an in-memory chunk store of the chunk layer
(:class:`swarm.chunks.store.MemoryChunks`) with the push tree's bookkeeping. Its manifest was
verified before the assembly exists (:meth:`VersionStore.accept`), and every chunk is checked
against the manifest's SHA-256 on arrival, so whatever a relay sends, only the learner's bytes are
kept and forwarded. ``order`` lists the chunk indices in arrival order: relays forward
from it, so a chunk fetched by repair flows on down the tree like a pushed one.

A store keys its assemblies by ``(version, layer range)``: the learner holds, per version,
the whole adapter and every registered range's slice. A node's store takes only the
manifests of its own range (``layer_range``; ``None``: the whole adapter) and refuses the
others, however genuinely signed.
"""

from __future__ import annotations

import logging
import time

import trio

from swarm.changes import Changes

from swarm.chunks.manifest import ManifestError
from swarm.chunks.store import MemoryChunks
from swarm.dissem.manifest import (
    LayerRange, adapter_content_id, canonical_bytes, content_key, describe, range_of, verify_manifest,
)
from swarm.proto.dissem import Manifest

log = logging.getLogger(__name__)


class Assembly(MemoryChunks):
    manifest: Manifest

    def __init__(self, manifest: Manifest, chunks: list[bytes] | None = None) -> None:
        super().__init__(manifest, chunks)
        #: What chunk requests name this version's manifest by.
        self.content_id = adapter_content_id(manifest)
        self.complete = trio.Event()
        self._changed = Changes()
        #: Chunks that came down push streams / through repair fetches / were rejected.
        self.pushed = 0
        self.repaired = 0
        self.rejected = 0
        #: Verified chunks per sender peer id (who relayed or served what).
        self.sources: dict[str, int] = {}
        self.completed_at = 0.0
        self.last_progress = trio.current_time()
        #: Peers that sent a chunk failing its hash: never asked again for this version.
        self.bad_peers: set[str] = set()
        #: Chunks to repair: ``(stripe, stripes)`` pairs whose push stream failed, or all.
        self._failed: set[tuple[int, int]] = set()
        self._failed_all = False
        self.repair_idle_rounds = 0
        #: Whether completion was already reported (a late stream must not report it again).
        self.reported = False
        if len(self.order) == self.n:
            self._finish()

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def layer_range(self) -> LayerRange:
        """The layer range this version's manifest covers (``None``: the whole adapter)."""
        return range_of(self.manifest.layers)

    @property
    def key(self) -> tuple[int, LayerRange]:
        return content_key(self.manifest)

    def missing(self, stripe: int | None = None, stripes: int = 1) -> list[int]:
        return [i for i, c in enumerate(self.chunks) if c is None and (stripe is None or i % stripes == stripe)]

    def add(self, index: int, data: bytes, *, source: str = "", repaired: bool = False) -> bool:
        """Store chunk ``index`` if it matches the manifest. Returns False (and logs) for a
        bad chunk; a duplicate of a held chunk is ignored (True)."""
        if self.has(index):
            return True
        if not super().add(index, data):
            self.rejected += 1
            log.warning("rejected chunk %d of v%d from %s: size or SHA-256 does not match the manifest",
                        index, self.version, source[-8:])
            return False
        self.sources[source] = self.sources.get(source, 0) + 1
        if repaired:
            self.repaired += 1
        else:
            self.pushed += 1
        self.last_progress = trio.current_time()
        self._poke()
        if len(self.order) == self.n:
            self._finish()
        return True

    def _finish(self) -> None:
        self.completed_at = time.time()
        self.complete.set()
        self._changed.notify()

    def _poke(self) -> None:
        self._changed.notify()

    def fail_stripe(self, stripe: int, stripes: int, parent: str = "") -> None:
        """The push stream of this stripe ended early: its missing chunks need repair."""
        self._failed.add((stripe, stripes))
        self._poke()

    def fail_all(self) -> None:
        """Every missing chunk needs repair (no progress, or no push stream at all)."""
        if not self._failed_all:
            self._failed_all = True
            self._poke()

    def failed_missing(self) -> list[int]:
        """Missing chunks that repair should fetch now."""
        if self._failed_all:
            return self.missing()
        return [i for i in self.missing() if any(i % n == s for s, n in self._failed)]

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def payload(self) -> bytes:
        if not self.complete.is_set():
            raise RuntimeError(f"v{self.version} is not complete")
        return super().payload()


class VersionStore:
    """Versions held by one peer; keeps the newest ``keep`` version numbers (each with
    whatever layer ranges of it are held)."""

    def __init__(self, learner_peer_id: str, run_id: str | None = None, keep: int = 4,
                 layer_range: LayerRange = None) -> None:
        self.learner_peer_id = learner_peer_id
        self.run_id = run_id
        self.keep = keep
        #: The only manifests :meth:`accept` takes: of this layer range (``None``: the whole adapter).
        self.layer_range = layer_range
        self.versions: dict[tuple[int, LayerRange], Assembly] = {}
        self._by_id: dict[bytes, Assembly] = {}
        self._new_version = Changes()

    def accept(self, manifest: Manifest) -> Assembly:
        """The assembly of a verified ``manifest``: raises :class:`ManifestError` for a
        forged or altered manifest, one for another layer range than this store's, or one
        that contradicts the manifest already held."""
        held = self.versions.get(content_key(manifest))
        if held is not None:
            if canonical_bytes(held.manifest) != canonical_bytes(manifest):
                raise ManifestError(f"a different manifest for v{manifest.version} is already held")
            return held
        verify_manifest(manifest, self.learner_peer_id, self.run_id)
        rng = range_of(manifest.layers)
        if rng != self.layer_range:
            raise ManifestError(f"manifest v{manifest.version} covers {describe(rng)}; "
                                f"this node takes {describe(self.layer_range)} only")
        return self.add(Assembly(manifest))

    def add(self, assembly: Assembly) -> Assembly:
        self.versions[assembly.key] = assembly
        kept = set(sorted({v for v, _ in self.versions})[-self.keep:])
        for key in [k for k in self.versions if k[0] not in kept]:
            del self.versions[key]
        self._by_id = {a.content_id: a for a in self.versions.values()}
        self._new_version.notify()
        return assembly

    def get(self, version: int, layer_range: LayerRange = None) -> Assembly | None:
        """The assembly of ``version``'s manifest for ``layer_range`` (``None``: the whole adapter)."""
        return self.versions.get((version, layer_range))

    def by_content_id(self, content_id: bytes) -> Assembly | None:
        """The assembly whose manifest has ``content_id`` (what chunk requests name)."""
        return self._by_id.get(content_id)

    async def wait_version(self, version: int, layer_range: LayerRange = None) -> Assembly:
        while (version, layer_range) not in self.versions:
            await self._new_version.wait()
        return self.versions[(version, layer_range)]
