"""A run directory's life: a new run, a resumed one, or an old one overwritten on purpose.

A run directory that already holds a run (its ``metrics.jsonl`` or checkpoints) is never
reused silently: ``--resume`` continues it, ``--overwrite`` clears its outputs first (keeping
``identity/``, the learner's key, so nodes that pinned its peer id still find it), and
anything else is refused before the learner loads a model.
"""

from __future__ import annotations

import shutil
from pathlib import Path

#: Entries of a run directory that a new run must not inherit (the learner's key is kept).
KEEP_ON_OVERWRITE = ("identity",)


def holds_run(run_dir: Path) -> bool:
    """True when ``run_dir`` has the outputs of an earlier run: rows in ``metrics.jsonl`` or a checkpoint."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    ckpts = run_dir / "checkpoints"
    return (metrics.is_file() and metrics.stat().st_size > 0) or (ckpts.is_dir() and any(ckpts.iterdir()))


def reuse_problem(run_dir: Path, resume: bool, overwrite: bool) -> str | None:
    """Why this launch may not use ``run_dir`` (None: it may). Pure except for reading the directory."""
    if resume and overwrite:
        return "--resume and --overwrite contradict each other: give one"
    if resume:
        return None if holds_run(run_dir) else f"--resume: {run_dir} holds no run to continue (no metrics.jsonl or checkpoints)"
    if holds_run(run_dir) and not overwrite:
        return (f"{run_dir} already holds a run; continue it with --resume, replace it with --overwrite, "
                f"or give another --run-dir")
    return None


def clear_outputs(run_dir: Path) -> list[str]:
    """Remove an earlier run's outputs from ``run_dir`` (everything but :data:`KEEP_ON_OVERWRITE`);
    returns the names removed."""
    run_dir = Path(run_dir)
    removed: list[str] = []
    if not run_dir.is_dir():
        return removed
    for entry in sorted(run_dir.iterdir()):
        if entry.name in KEEP_ON_OVERWRITE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
        removed.append(entry.name)
    return removed
