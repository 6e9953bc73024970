"""Chunk stores: where a peer keeps the chunks of one piece of content, checked on arrival.

:class:`ChunkStore` is the interface the chunk server and the puller use. Implementations:

- :class:`MemoryChunks`: chunks in memory (adapter versions; ``swarm.dissem.store.Assembly``
  builds on it);
- :class:`FileChunks`: a complete payload that is the concatenation of files already on disk
  (the learner's model, a node's own copy of it), read on demand;
- :class:`swarm.chunks.disk.DiskChunks`: a payload written chunk by chunk to disk, resumable
  after a kill.

Every store checks a chunk against its manifest's SHA-256 before keeping it, so whatever a peer
sends, a store holds only the learner's bytes. The have-map of a store is a bitmap of the chunks
it holds (:func:`bitmap`), sent with every chunk reply.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Protocol

from swarm.chunks.manifest import ChunkedManifest, chunk_ok, chunk_range


class ChunkStore(Protocol):
    """The chunks of one piece of content held by this peer (fully or in part)."""

    @property
    def manifest(self) -> ChunkedManifest: ...

    @property
    def n(self) -> int:
        """Chunks of the content."""

    def has(self, index: int) -> bool: ...

    def read(self, index: int) -> bytes | None:
        """Chunk ``index`` if held (may block on disk: servers call it from a thread)."""

    def add(self, index: int, data: bytes) -> bool:
        """Keep chunk ``index`` if it matches the manifest (False: bad size or hash)."""

    def missing(self) -> list[int]: ...

    def count(self) -> int: ...

    def have_bitmap(self) -> bytes: ...


def bitmap(held, n: int) -> bytes:
    """The have-map of chunks ``held`` out of ``n``: bit ``i % 8`` of byte ``i // 8``."""
    out = bytearray((n + 7) // 8)
    for i in held:
        if 0 <= i < n:
            out[i // 8] |= 1 << (i % 8)
    return bytes(out)


def from_bitmap(data: bytes, n: int) -> set[int]:
    """The chunk indices a have-map names (bits past ``n`` are ignored)."""
    return {i for i in range(min(n, len(data) * 8)) if data[i // 8] >> (i % 8) & 1}


class MemoryChunks:
    """Chunks in memory. ``order`` lists the held indices in arrival order."""

    def __init__(self, manifest: ChunkedManifest, chunks: list[bytes] | None = None) -> None:
        self.manifest = manifest
        self.n = len(manifest.chunk_hashes)
        self.chunks: list[bytes | None] = list(chunks) if chunks is not None else [None] * self.n
        if len(self.chunks) != self.n:
            raise ValueError(f"{len(self.chunks)} chunks for a manifest of {self.n}")
        self.order: list[int] = [i for i, c in enumerate(self.chunks) if c is not None]

    def has(self, index: int) -> bool:
        return 0 <= index < self.n and self.chunks[index] is not None

    def read(self, index: int) -> bytes | None:
        return self.chunks[index] if self.has(index) else None

    def add(self, index: int, data: bytes) -> bool:
        if self.has(index):
            return True
        if not chunk_ok(self.manifest, index, data):
            return False
        self.chunks[index] = bytes(data)
        self.order.append(index)
        return True

    def missing(self) -> list[int]:
        return [i for i, c in enumerate(self.chunks) if c is None]

    def count(self) -> int:
        return len(self.order)

    def have_bitmap(self) -> bytes:
        return bitmap(self.order, self.n)

    def payload(self) -> bytes:
        if len(self.order) != self.n:
            raise RuntimeError(f"{self.n - len(self.order)} of {self.n} chunks missing")
        return b"".join(self.chunks)  # type: ignore[arg-type]


class FilesReader:
    """Byte ranges of the concatenation of ``files`` (``(path, size)`` in order)."""

    def __init__(self, files: list[tuple[Path, int]]) -> None:
        self.files = files

    def read(self, offset: int, size: int) -> bytes:
        out = bytearray()
        start = 0
        for path, fsize in self.files:
            end = start + fsize
            if offset < end and offset + size > start:
                lo = max(offset, start) - start
                n = min(offset + size, end) - start - lo
                with open(path, "rb") as f:
                    f.seek(lo)
                    out += f.read(n)
            start = end
        return bytes(out)


class FileChunks:
    """A complete payload: the concatenation of ``files`` (``(path, size)``), already on disk
    and trusted (the learner's own files, or a copy checked against its hashes)."""

    def __init__(self, manifest: ChunkedManifest, files: list[tuple[Path, int]]) -> None:
        for p, size in files:
            if not Path(p).is_file() or Path(p).stat().st_size != size:
                raise FileNotFoundError(f"{p} is missing or does not have the size the manifest says ({size})")
        self.manifest = manifest
        self.n = len(manifest.chunk_hashes)
        self.files = files
        self._reader = FilesReader(files)
        self._lock = threading.Lock()

    def has(self, index: int) -> bool:
        return 0 <= index < self.n

    def read(self, index: int) -> bytes | None:
        if not self.has(index):
            return None
        off, size = chunk_range(self.manifest, index)
        with self._lock:
            return self._reader.read(off, size)

    def add(self, index: int, data: bytes) -> bool:
        return self.has(index)

    def missing(self) -> list[int]:
        return []

    def count(self) -> int:
        return self.n

    def have_bitmap(self) -> bytes:
        return bitmap(range(self.n), self.n)
