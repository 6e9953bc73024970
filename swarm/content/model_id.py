"""The identity of a base model: its content hash.

Definition (``content_sha256``), the same on the learner and every node:

- a single file (a GGUF): the SHA-256 of the file's bytes, i.e. what ``sha256sum model.gguf``
  prints;
- a directory (an HF model directory): the SHA-256 of its listing, one line per regular file
  ``"<hex sha256 of the file>  <relative POSIX path>\\n"``, lines sorted by path (the output
  of ``sha256sum`` over the sorted file list, without a leading ``./``). Hidden files and
  directories (a name starting with ``.``) and the converter's marker
  (``echo_swarm_source.json``) are not part of the model.

Two copies of a model at different paths, or with different mtimes, have the same hash;
a single changed byte gives another. Hashing reads every byte, so per-file digests are
cached in ``<cache>/hashes.json`` keyed by resolved path, size and mtime (ns): a 100 MB file
is hashed once, not on every start.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

#: Files inside a model directory that are not part of the model.
EXCLUDED_NAMES = frozenset({"echo_swarm_source.json"})
#: Bytes read per call while hashing.
READ_BYTES = 4 * 1024 * 1024
#: Name of the digest cache inside the cache directory.
HASH_CACHE_FILE = "hashes.json"


@dataclass(frozen=True)
class ModelFileRef:
    """One file of a model: path relative to the model root (``""`` root = the file itself)."""

    relpath: str
    size: int
    sha256: str


def short(sha: str) -> str:
    """The first 12 hex digits, for messages."""
    return sha[:12] if sha else "(unknown)"


def model_files(path: Path) -> list[tuple[str, Path]]:
    """``(relative POSIX path, absolute path)`` of every file of the model at ``path``,
    sorted by relative path. A single file is its own model (relative path = its name)."""
    path = Path(path)
    if path.is_file():
        return [(path.name, path.resolve())]
    if not path.is_dir():
        raise FileNotFoundError(f"model not found: {path}")
    out = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            if name.startswith(".") or name in EXCLUDED_NAMES:
                continue
            full = Path(root) / name
            if full.is_file():
                out.append((full.relative_to(path).as_posix(), full.resolve()))
    if not out:
        raise FileNotFoundError(f"model directory {path} holds no files")
    return sorted(out)


def listing_sha256(files: list[ModelFileRef]) -> str:
    """Content hash of a directory model from its files' digests (see the module docstring)."""
    lines = "".join(f"{f.sha256}  {f.relpath}\n" for f in sorted(files, key=lambda f: f.relpath))
    return hashlib.sha256(lines.encode()).hexdigest()


def content_sha256_of(files: list[ModelFileRef], is_dir: bool) -> str:
    if not is_dir:
        if len(files) != 1:
            raise ValueError(f"a single-file model has one file, not {len(files)}")
        return files[0].sha256
    return listing_sha256(files)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(READ_BYTES):
            h.update(block)
    return h.hexdigest()


class HashCache:
    """Per-file SHA-256 digests keyed by resolved path, size and mtime, kept in a JSON file."""

    def __init__(self, cache_dir: Path | None) -> None:
        self.path = Path(cache_dir) / HASH_CACHE_FILE if cache_dir else None

    def _load(self) -> dict:
        if self.path is None or not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}  # a damaged cache only costs a re-hash
        return data if isinstance(data, dict) else {}

    @staticmethod
    def _key(path: Path) -> str:
        st = path.stat()
        return f"{path.resolve()}\x1f{st.st_size}\x1f{st.st_mtime_ns}"

    def digest(self, path: Path) -> str:
        key = self._key(path)
        hit = self._load().get(key)
        if isinstance(hit, str) and len(hit) == 64:
            return hit
        sha = file_sha256(path)
        if self.path is not None:
            self._store(key, sha)
        return sha

    def _store(self, key: str, sha: str) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self._load()
            data[key] = sha
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(data, indent=0, sort_keys=True))
            os.replace(tmp, self.path)


def describe(path: Path, cache_dir: Path | None = None) -> tuple[str, list[ModelFileRef]]:
    """``(content hash, files)`` of the model at ``path`` (digests cached under ``cache_dir``)."""
    path = Path(path)
    cache = HashCache(cache_dir)
    refs = [ModelFileRef(rel, full.stat().st_size, cache.digest(full)) for rel, full in model_files(path)]
    return content_sha256_of(refs, path.is_dir()), refs


def content_sha256(path: Path, cache_dir: Path | None = None) -> str:
    """The content hash of the model (GGUF file or HF directory) at ``path``."""
    return describe(path, cache_dir)[0]
