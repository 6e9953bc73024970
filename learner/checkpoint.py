"""Resumable checkpoints: ``<run_dir>/checkpoints/step_<n>/`` holds the trainer state
(adapter, optimiser, RNG) and ``loop.json`` (step, version, next problem, wall time);
``checkpoints/latest`` names the newest complete one."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

#: Complete checkpoints kept on disk (older ones are deleted).
KEEP_CHECKPOINTS = 2


def save_state(run_dir: Path, trainer, state) -> Path:
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{state.step}"
    tmp = root / f".tmp_step_{state.step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    trainer.save_checkpoint(tmp / "trainer.pt")
    (tmp / "loop.json").write_text(json.dumps(dataclasses.asdict(state)))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    (root / "latest.tmp").write_text(final.name)
    (root / "latest.tmp").replace(root / "latest")
    done = sorted((p for p in root.glob("step_*") if p.is_dir()), key=lambda p: int(p.name.split("_")[1]))
    for old in done[:-KEEP_CHECKPOINTS]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if path.is_dir() else None


def load_state(run_dir: Path, trainer):
    from learner.loop import LoopState

    path = latest_checkpoint(run_dir)
    if path is None:
        raise FileNotFoundError(f"no checkpoint to resume from in {Path(run_dir) / 'checkpoints'}")
    trainer.load_checkpoint(path / "trainer.pt")
    return LoopState(**json.loads((path / "loop.json").read_text()))
