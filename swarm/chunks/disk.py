"""A payload written to disk chunk by chunk: resumable, every chunk hash-checked.

Layout under the store's directory::

    manifest.msgpack   the signed manifest this copy follows (its wire form)
    payload.part       the payload, written chunk by chunk at each chunk's offset (sparse)
    have.txt           indices of verified chunks, one per line, appended

A chunk is written to ``payload.part`` before its index is appended to ``have.txt``, so a killed
process loses at most the chunk it was writing; on reopening, every listed chunk is checked
against the manifest again, and a directory that followed another manifest (another chunking)
starts over. What the payload becomes once complete is the content kind's business (the base
model splits it into its files: ``swarm.content.store``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgpack

from swarm.chunks.manifest import ChunkedManifest, chunk_ok, chunk_range, unsigned_form, unsigned_wire
from swarm.chunks.store import bitmap

log = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.msgpack"
PAYLOAD_FILE = "payload.part"
HAVE_FILE = "have.txt"


def _same_manifest(path: Path, manifest: ChunkedManifest) -> bool:
    """Whether the manifest stored at ``path`` is ``manifest`` (signature aside)."""
    try:
        old = msgpack.unpackb(path.read_bytes(), raw=False)
    except (OSError, ValueError, msgpack.UnpackException):
        return False
    return isinstance(old, dict) and unsigned_wire(old) == unsigned_form(manifest)


class DiskChunks:
    """The chunks of ``manifest`` under ``directory`` (created if needed)."""

    def __init__(self, manifest: ChunkedManifest, directory: Path) -> None:
        self.manifest = manifest
        self.n = len(manifest.chunk_hashes)
        self.dir = Path(directory)
        self.payload_path = self.dir / PAYLOAD_FILE
        self.have_path = self.dir / HAVE_FILE
        self.dir.mkdir(parents=True, exist_ok=True)
        mpath = self.dir / MANIFEST_FILE
        if mpath.is_file() and not _same_manifest(mpath, manifest):  # another chunking: start over
            self.payload_path.unlink(missing_ok=True)
            self.have_path.unlink(missing_ok=True)
        mpath.write_bytes(msgpack.packb(manifest.to_wire(), use_bin_type=True))
        self.held: set[int] = self._load_have()

    def _load_have(self) -> set[int]:
        if not self.have_path.is_file() or not self.payload_path.is_file():
            return set()
        listed = {int(line) for line in self.have_path.read_text().splitlines() if line.strip().isdigit()}
        good = set()
        with open(self.payload_path, "rb") as f:
            for i in sorted(listed):
                if i >= self.n:
                    continue
                off, size = chunk_range(self.manifest, i)
                f.seek(off)
                if chunk_ok(self.manifest, i, f.read(size)):
                    good.add(i)
        if good != listed:
            log.warning("%s: %d listed chunk(s) failed their check on resume", self.dir.name[:12],
                        len(listed) - len(good))
        self.have_path.write_text("".join(f"{i}\n" for i in sorted(good)))
        return good

    def has(self, index: int) -> bool:
        return index in self.held

    def read(self, index: int) -> bytes | None:
        if index not in self.held:
            return None
        off, size = chunk_range(self.manifest, index)
        with open(self.payload_path, "rb") as f:
            f.seek(off)
            return f.read(size)

    def add(self, index: int, data: bytes) -> bool:
        if index in self.held:
            return True
        if not chunk_ok(self.manifest, index, data):
            return False
        off, _ = chunk_range(self.manifest, index)
        fd = os.open(self.payload_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, off)
        finally:
            os.close(fd)
        with open(self.have_path, "a") as f:
            f.write(f"{index}\n")
        self.held.add(index)
        return True

    def missing(self) -> list[int]:
        return [i for i in range(self.n) if i not in self.held]

    def count(self) -> int:
        return len(self.held)

    def have_bitmap(self) -> bytes:
        return bitmap(self.held, self.n)
