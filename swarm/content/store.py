"""A model held by this peer, fully or in part: a chunk store (``swarm.chunks``) that becomes
the model's files once complete.

Layout under a store root, one directory per content hash::

    <root>/<sha256>/manifest.msgpack, payload.part, have.txt   while fetching (``swarm.chunks.disk``)
    <root>/<sha256>/model/...          the finished model (GGUF file or HF directory files)
    <root>/<sha256>/complete.json      written last: the copy is complete and checked

While fetching, chunks go to a resumable :class:`~swarm.chunks.disk.DiskChunks`;
:meth:`ModelCopy.finish` splits the payload into the model's files, checks every file's SHA-256
and writes ``complete.json``; from then on (and for a model already on disk: the learner's, a
node's own copy) chunks are read from the files (:class:`~swarm.chunks.store.FileChunks`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from pathlib import Path

import msgpack

from swarm.chunks.disk import MANIFEST_FILE, DiskChunks
from swarm.chunks.store import FileChunks
from swarm.content.model_id import file_sha256
from swarm.proto.model import ModelManifest

log = logging.getLogger(__name__)

COMPLETE_MARKER = "complete.json"


class ModelCopy:
    """One model held (fully or partly) by this peer; a :class:`~swarm.chunks.store.ChunkStore`."""

    def __init__(self, manifest: ModelManifest, directory: Path | None = None,
                 source: Path | None = None) -> None:
        self.manifest = manifest
        self.n = len(manifest.chunk_hashes)
        self.dir = Path(directory) if directory is not None else None
        self.model_path: Path | None = None
        self._files: FileChunks | None = None
        self._disk: DiskChunks | None = None
        #: Held while the payload becomes the model's files (chunks are served from threads).
        self._lock = threading.Lock()
        if source is not None:  # complete files already on disk (the learner's, or a node's own copy)
            self._use_files(Path(source))
        elif self.dir is not None:
            self._open()

    # ---------------------------------------------------------------- the chunk store
    @property
    def complete(self) -> bool:
        return self._files is not None

    @property
    def held(self) -> set[int]:
        """Verified chunks of an incomplete copy (empty once complete)."""
        return set(self._disk.held) if self._disk is not None and self._files is None else set()

    def _chunks(self) -> FileChunks | DiskChunks | None:
        return self._files or self._disk

    def has(self, i: int) -> bool:
        store = self._chunks()
        return store is not None and store.has(i)

    def count(self) -> int:
        store = self._chunks()
        return store.count() if store is not None else 0

    def missing(self) -> list[int]:
        store = self._chunks()
        return store.missing() if store is not None else list(range(self.n))

    def have_bitmap(self) -> bytes:
        store = self._chunks()
        return store.have_bitmap() if store is not None else b""

    def add(self, i: int, data: bytes) -> bool:
        """Store chunk ``i`` if it matches the manifest (False: bad size or hash)."""
        store = self._chunks()
        return store is not None and store.add(i, data)

    def read(self, i: int) -> bytes | None:
        """Chunk ``i`` if held."""
        with self._lock:
            store = self._chunks()
            return store.read(i) if store is not None else None

    # ---------------------------------------------------------------- disk
    def _use_files(self, path: Path) -> None:
        m = self.manifest
        if m.kind == "gguf":
            files = [(path if path.is_file() else path / m.files[0].relpath, m.files[0].size)]
        else:
            files = [(path / f.relpath, f.size) for f in m.files]
        try:
            self._files = FileChunks(m, files)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"{e} for model {m.content_sha256[:12]}") from e
        self.model_path = files[0][0] if m.kind == "gguf" else path

    def _open(self) -> None:
        d = self.dir
        assert d is not None  # the constructor opens a directory it was given
        d.mkdir(parents=True, exist_ok=True)
        if (d / COMPLETE_MARKER).is_file():
            try:
                model_dir = d / "model"
                self._use_files(model_dir if self.manifest.kind == "hf" else model_dir / self.manifest.files[0].relpath)
                return
            except FileNotFoundError as e:
                log.warning("cached model %s is damaged (%s); fetching it again", d.name[:12], e)
                (d / COMPLETE_MARKER).unlink()
        self._disk = DiskChunks(self.manifest, d)

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
        m, d, disk = self.manifest, self.dir, self._disk
        if d is None or disk is None:
            raise RuntimeError("this copy has no directory to finish in")
        payload, model_dir = disk.payload_path, d / "model"
        if model_dir.exists():
            shutil.rmtree(model_dir)
        model_dir.mkdir()
        if m.kind == "gguf":
            with open(payload, "r+b") as fh:
                fh.truncate(m.total_bytes)
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
        disk.have_path.unlink(missing_ok=True)
        (d / COMPLETE_MARKER).write_text(json.dumps({"content_sha256": m.content_sha256, "name": m.name,
                                                     "kind": m.kind, "bytes": m.total_bytes}))
        self._use_files(model_dir if m.kind == "hf" else model_dir / m.files[0].relpath)
        self._disk = None
        return self.model_path  # type: ignore[return-value]


def cached_model(root: Path, sha: str) -> Path | None:
    """The complete cached model ``sha`` under ``root`` (GGUF file or HF directory), or None."""
    d = Path(root) / sha
    if not (d / COMPLETE_MARKER).is_file():
        return None
    try:
        info = json.loads((d / COMPLETE_MARKER).read_text())
        m = ModelManifest.from_wire(msgpack.unpackb((d / MANIFEST_FILE).read_bytes(), raw=False))
    except Exception:
        return None
    if info.get("kind") == "hf":
        return d / "model"
    p = d / "model" / m.files[0].relpath
    return p if p.is_file() else None
