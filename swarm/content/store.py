"""A model's chunks on disk: resumable downloads and serving what is held.

Layout under a store root, one directory per content hash::

    <root>/<sha256>/manifest.msgpack   the signed manifest this copy follows
    <root>/<sha256>/payload.part       the concatenated files, written chunk by chunk (sparse)
    <root>/<sha256>/have.txt           indices of verified chunks, one per line, appended
    <root>/<sha256>/model/...          the finished model (GGUF file or HF directory files)
    <root>/<sha256>/complete.json      written last: the copy is complete and checked

A chunk is written to ``payload.part`` before its index is appended to ``have.txt``, so a
killed process loses at most the chunk it was writing; on reopening, every listed chunk is
checked against the manifest again. :meth:`ModelCopy.finish` splits the payload into the
model's files, checks every file's SHA-256 and writes ``complete.json``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from pathlib import Path

import msgpack

from swarm.content.manifest import canonical_bytes, chunk_ok, chunk_range
from swarm.content.model_id import file_sha256
from swarm.proto.model import ModelManifest

log = logging.getLogger(__name__)

COMPLETE_MARKER = "complete.json"


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


def bitmap(held: set[int], n: int) -> bytes:
    out = bytearray((n + 7) // 8)
    for i in held:
        if 0 <= i < n:
            out[i // 8] |= 1 << (i % 8)
    return bytes(out)


def from_bitmap(data: bytes, n: int) -> set[int]:
    return {i for i in range(min(n, len(data) * 8)) if data[i // 8] >> (i % 8) & 1}


class ModelCopy:
    """One model held (fully or partly) by this peer."""

    def __init__(self, manifest: ModelManifest, directory: Path | None = None,
                 source: Path | None = None) -> None:
        self.manifest = manifest
        self.n = len(manifest.chunk_hashes)
        self.dir = directory
        self.held: set[int] = set()
        self._reader: FilesReader | None = None
        self.model_path: Path | None = None
        #: Held while the payload becomes the model's files (chunks are served from threads).
        self._lock = threading.Lock()
        if source is not None:  # complete files already on disk (the learner's, or a node's own copy)
            self._use_files(Path(source))
        elif directory is not None:
            self._open()

    # ---------------------------------------------------------------- state
    @property
    def complete(self) -> bool:
        return self._reader is not None

    def has(self, i: int) -> bool:
        return self.complete and 0 <= i < self.n or i in self.held

    def count(self) -> int:
        return self.n if self.complete else len(self.held)

    def missing(self) -> list[int]:
        return [] if self.complete else [i for i in range(self.n) if i not in self.held]

    def have_bitmap(self) -> bytes:
        return bitmap(set(range(self.n)) if self.complete else self.held, self.n)

    def _use_files(self, path: Path) -> None:
        m = self.manifest
        if m.kind == "gguf":
            files = [(path if path.is_file() else path / m.files[0].relpath, m.files[0].size)]
        else:
            files = [(path / f.relpath, f.size) for f in m.files]
        for p, size in files:
            if not p.is_file() or p.stat().st_size != size:
                raise FileNotFoundError(f"{p} is missing or has the wrong size for model {m.content_sha256[:12]}")
        self._reader = FilesReader(files)
        self.model_path = files[0][0] if m.kind == "gguf" else path
        self.held = set()

    # ---------------------------------------------------------------- disk
    def _open(self) -> None:
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        model_dir = d / "model"
        if (d / COMPLETE_MARKER).is_file():
            try:
                self._use_files(model_dir if self.manifest.kind == "hf" else model_dir / self.manifest.files[0].relpath)
                return
            except FileNotFoundError as e:
                log.warning("cached model %s is damaged (%s); fetching it again", d.name[:12], e)
                (d / COMPLETE_MARKER).unlink()
        mpath = d / "manifest.msgpack"
        if mpath.is_file():
            try:
                old = ModelManifest.from_wire(msgpack.unpackb(mpath.read_bytes(), raw=False))
                same = canonical_bytes(old) == canonical_bytes(self.manifest)
            except Exception:
                same = False
            if not same:  # another chunking: start over
                for name in ("payload.part", "have.txt"):
                    (d / name).unlink(missing_ok=True)
        mpath.write_bytes(msgpack.packb(self.manifest.to_wire(), use_bin_type=True))
        self.held = self._load_have()

    def _load_have(self) -> set[int]:
        have_path, payload = self.dir / "have.txt", self.dir / "payload.part"
        if not have_path.is_file() or not payload.is_file():
            return set()
        listed = set()
        for line in have_path.read_text().splitlines():
            if line.strip().isdigit():
                listed.add(int(line))
        good = set()
        with open(payload, "rb") as f:
            for i in sorted(listed):
                if i >= self.n:
                    continue
                off, size = chunk_range(self.manifest, i)
                f.seek(off)
                if chunk_ok(self.manifest, i, f.read(size)):
                    good.add(i)
        if good != listed:
            log.warning("model %s: %d listed chunk(s) failed their check on resume", self.dir.name[:12],
                        len(listed) - len(good))
        have_path.write_text("".join(f"{i}\n" for i in sorted(good)))
        return good

    def add(self, i: int, data: bytes) -> bool:
        """Store chunk ``i`` if it matches the manifest (False: bad size or hash)."""
        if self.has(i):
            return True
        if self.dir is None or not chunk_ok(self.manifest, i, data):
            return False
        off, _ = chunk_range(self.manifest, i)
        fd = os.open(self.dir / "payload.part", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, off)
        finally:
            os.close(fd)
        with open(self.dir / "have.txt", "a") as f:
            f.write(f"{i}\n")
        self.held.add(i)
        return True

    def read(self, i: int) -> bytes | None:
        """Chunk ``i`` if held."""
        if not self.has(i):
            return None
        off, size = chunk_range(self.manifest, i)
        with self._lock:
            if self._reader is not None:
                return self._reader.read(off, size)
            with open(self.dir / "payload.part", "rb") as f:
                f.seek(off)
                return f.read(size)

    def finish(self) -> Path:
        """Split the complete payload into the model's files, check each file's SHA-256 and
        mark the copy complete. Returns the model path (GGUF file or HF directory)."""
        if self.complete:
            return self.model_path  # type: ignore[return-value]
        if self.missing():
            raise RuntimeError(f"{len(self.missing())} chunk(s) still missing")
        with self._lock:
            return self._finish()

    def _finish(self) -> Path:
        m, d = self.manifest, self.dir
        payload, model_dir = d / "payload.part", d / "model"
        if model_dir.exists():
            shutil.rmtree(model_dir)
        model_dir.mkdir()
        if m.kind == "gguf":
            with open(payload, "r+b") as f:
                f.truncate(m.total_bytes)
            os.replace(payload, model_dir / m.files[0].relpath)
        else:
            with open(payload, "rb") as src:
                for f in m.files:
                    out = model_dir / f.relpath
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with open(out, "wb") as dst:
                        left = f.size
                        while left:
                            block = src.read(min(left, 4 << 20))
                            dst.write(block)
                            left -= len(block)
            payload.unlink()
        for f in m.files:
            got = file_sha256(model_dir / f.relpath)
            if got != f.sha256:
                raise RuntimeError(f"{f.relpath}: SHA-256 {got[:12]} does not match the manifest's {f.sha256[:12]}")
        (d / "have.txt").unlink(missing_ok=True)
        (d / COMPLETE_MARKER).write_text(json.dumps({"content_sha256": m.content_sha256, "name": m.name,
                                                     "kind": m.kind, "bytes": m.total_bytes}))
        self._use_files(model_dir if m.kind == "hf" else model_dir / m.files[0].relpath)
        return self.model_path  # type: ignore[return-value]


def cached_model(root: Path, sha: str) -> Path | None:
    """The complete cached model ``sha`` under ``root`` (GGUF file or HF directory), or None."""
    d = Path(root) / sha
    if not (d / COMPLETE_MARKER).is_file():
        return None
    try:
        info = json.loads((d / COMPLETE_MARKER).read_text())
        m = ModelManifest.from_wire(msgpack.unpackb((d / "manifest.msgpack").read_bytes(), raw=False))
    except Exception:
        return None
    if info.get("kind") == "hf":
        return d / "model"
    p = d / "model" / m.files[0].relpath
    return p if p.is_file() else None
