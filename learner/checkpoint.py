"""Resumable checkpoints: ``<run_dir>/checkpoints/step_<n>/`` holds the trainer state
(adapter, optimiser, RNG) and ``loop.json`` (step, version, next problem, wall time);
``checkpoints/latest`` names the newest complete one.

Resume rewinds the run exactly to the checkpoint: ``open_groups.json`` beside ``loop.json``
lists the problems that were handed out but not trained when it was written (pending, leased,
held for verification or waiting in the async replay buffer); they are issued again first, so none is lost or
trained twice. ``metrics.jsonl`` is cut back to the checkpoint's step (see
:class:`learner.metrics.MetricsWriter`). ``<run_dir>/run.json`` keeps the run id across
restarts; nodes are told ``<run_id>~<n>`` after the n-th resume, because the adapter versions
after the checkpoint are trained again and differ from what they may have cached.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from learner.coordinator import Coordinator, GroupSpec
from learner.trainer_api import TrainerAPI
from learner.episodes import initial_prompt
from tasks.interface import SingleTurnTask, Tokenizer

#: Complete checkpoints kept on disk (older ones are deleted).
KEEP_CHECKPOINTS = 2


@dataclass
class LoopState:
    """Where the run is, saved with every checkpoint beside the trainer's own state."""

    step: int = 0
    version: int = 0
    next_problem: int = 0
    wall_s: float = 0.0


def save_state(run_dir: Path, trainer: TrainerAPI, state: LoopState, open_problems: list[str] | None = None) -> Path:
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{state.step}"
    tmp = root / f".tmp_step_{state.step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    trainer.save_checkpoint(tmp / "trainer.pt")
    (tmp / "loop.json").write_text(json.dumps(dataclasses.asdict(state)))
    (tmp / "open_groups.json").write_text(json.dumps(list(open_problems or [])))
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


def load_state(run_dir: Path, trainer: TrainerAPI) -> LoopState:
    path = latest_checkpoint(run_dir)
    if path is None:
        raise FileNotFoundError(f"no checkpoint to resume from in {Path(run_dir) / 'checkpoints'}")
    trainer.load_checkpoint(path / "trainer.pt")
    return LoopState(**json.loads((path / "loop.json").read_text()))


def load_open_problems(run_dir: Path) -> list[str]:
    """Problem refs handed out but untrained at the latest checkpoint (oldest first)."""
    path = latest_checkpoint(run_dir)
    f = path / "open_groups.json" if path is not None else None
    if f is None or not f.exists():
        return []
    refs = json.loads(f.read_text())
    if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
        raise ValueError(f"{f}: expected a list of problem refs")
    return refs


def open_problem_refs(coord: Coordinator) -> list[str]:
    """The problems of every group not yet trained or dropped, in the order they were added."""
    return coord.open_problem_refs()


def run_identity(run_dir: Path, resume: bool, fresh_id: str) -> tuple[str, str]:
    """(run id kept in ``run.json``, id announced to nodes). A new run stores ``fresh_id``; each
    resume keeps it and counts one more restart (announced as ``<id>~<restarts>``)."""
    path = Path(run_dir) / "run.json"
    run_id, restarts = fresh_id, 0
    if resume and path.exists():
        old = json.loads(path.read_text())
        run_id, restarts = str(old["run_id"]), int(old.get("restarts", 0)) + 1
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"run_id": run_id, "restarts": restarts}))
    tmp.replace(path)
    return run_id, (run_id if restarts == 0 else f"{run_id}~{restarts}")


def reissue_specs(refs: list[str], task: SingleTurnTask, tokenizer: Tokenizer, multi_turn: bool) -> list[GroupSpec]:
    """Group specs for problem refs saved by :func:`save_state`, built exactly as the step
    functions build them (same group id, same prompt), so a resumed run issues them again."""
    return [GroupSpec(f"g{ref}", initial_prompt(task, tokenizer, task.problem("train", int(ref)), multi_turn), ref)
            for ref in refs]
