"""A Hugging Face Hub cache written by hand, in huggingface_hub's own layout, for tests that
resolve models and datasets by Hub name with the network off: ``<kind>s--org--name/`` with
``blobs/<sha256>`` (the files), ``snapshots/<commit>/<path>`` (relative symlinks to the blobs) and
``refs/<ref>`` (the commit a branch points at)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

def put_repo(cache: Path, repo_type: str, repo_id: str, files: dict, commit: str | None = None, ref: str = "main") -> str:
    """Write ``files`` (relative path -> bytes or a file to copy) as snapshot ``commit`` of
    ``repo_id`` and point ``refs/<ref>`` at it; returns the commit."""
    kind = {"model": "models", "dataset": "datasets"}[repo_type]
    root = Path(cache) / f"{kind}--{repo_id.replace('/', '--')}"
    blobs = root / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    commit = commit or hashlib.sha1(json.dumps(sorted(files)).encode()).hexdigest()
    snap = root / "snapshots" / commit
    for rel, data in files.items():
        data = Path(data).read_bytes() if isinstance(data, Path) else data
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        dst = snap / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.exists() or dst.is_symlink():
            dst.unlink()
        dst.symlink_to(os.path.relpath(blobs / digest, dst.parent))
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / ref).write_text(commit)
    return commit
