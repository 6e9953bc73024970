"""peft adapters every N steps (``train.adapter_every``), beside the resumable checkpoints.

``<run_dir>/adapters/step-<n>/`` is a standard peft directory (``adapter_config.json`` +
``adapter_model.safetensors``): ``PeftModel.from_pretrained(base, dir)`` loads it, and
``swarm-learner export`` / ``eval --adapter`` take it. Unlike the checkpoints (the trainer's whole
state, two kept), every one is kept: they are the run's history of policies. Each is written under
a temporary name and renamed, so a directory named ``step-<n>`` is always complete. On resume the
ones after the checkpoint's step are removed: those steps are trained again and differ.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

ADAPTERS_DIR = "adapters"
FINAL_ADAPTER = "adapter"
_STEP = re.compile(r"step-(\d+)")


def step_adapter_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / ADAPTERS_DIR / f"step-{int(step)}"


def save_step_adapter(run_dir: Path, trainer: Any, step: int) -> Path:
    """Write the trainer's adapter (``Trainer.save_adapter``) as ``adapters/step-<step>/``."""
    final = step_adapter_dir(run_dir, step)
    tmp = final.with_name(f".tmp-{final.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.save_adapter(tmp)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def step_adapters(run_dir: Path) -> dict[int, Path]:
    """Step -> directory of every complete ``adapters/step-<n>/`` of a run, in step order."""
    root = Path(run_dir) / ADAPTERS_DIR
    found = {int(m[1]): p for p in root.glob("step-*") if p.is_dir() and (m := _STEP.fullmatch(p.name))}
    return dict(sorted(found.items()))


def cut_step_adapters(run_dir: Path, resume_step: int) -> list[Path]:
    """On resume: remove the adapters after ``resume_step`` and unfinished ones; returns what went."""
    gone = [p for step, p in step_adapters(run_dir).items() if step > resume_step]
    gone += list((Path(run_dir) / ADAPTERS_DIR).glob(".tmp-step-*"))
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def run_adapter(run_dir: Path) -> Path:
    """The adapter a run directory stands for: its final ``adapter/``, else its newest
    ``adapters/step-<n>/``; FileNotFoundError when it has neither."""
    run_dir = Path(run_dir)
    if (run_dir / FINAL_ADAPTER / "adapter_config.json").is_file():
        return run_dir / FINAL_ADAPTER
    steps = step_adapters(run_dir)
    if steps:
        return steps[max(steps)]
    raise FileNotFoundError(f"{run_dir}: no adapter/ and no adapters/step-<n>/ (has the run trained a step?)")
