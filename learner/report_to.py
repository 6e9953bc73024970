"""Where else the run's figures go: TensorBoard event files and Weights & Biases (offline).

``--report-to tensorboard`` (``[report] to = ["tensorboard"]``) writes TensorBoard event files
into the run directory, beside ``metrics.jsonl``, so ``tensorboard --logdir runs/`` shows every
run. ``wandb`` logs to a W&B run in offline mode (files under ``<run_dir>/wandb``; upload later
with ``wandb sync``) and needs the ``wandb`` package; naming it without the package is a config
error. Each sink gets exactly the rows of ``metrics.jsonl``: every numeric field as a scalar at
the row's ``step``, nested maps flattened to ``name/key`` (e.g. ``nodes/<peer>``, ``dropped/stale``);
text, lists and non-finite values are left out.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol

from learner.config import ReportConfig


class Sink(Protocol):
    def write(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def scalars_of(row: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric fields of a metrics row, nested maps flattened (module docstring); pure."""
    out: dict[str, float] = {}
    for k, v in row.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(scalars_of(v, f"{name}/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
            out[name] = float(v)
        elif isinstance(v, bool):
            out[name] = float(v)
    return out


class TensorBoardSink:
    """Event files in ``run_dir`` through torch's ``SummaryWriter``; flushed after every row."""

    def __init__(self, run_dir: Path, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(run_dir), purge_step=purge_step)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        for name, value in scalars.items():
            self._writer.add_scalar(name, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """An offline W&B run under ``run_dir/wandb`` (resumed by id on ``--resume``)."""

    def __init__(self, run_dir: Path, project: str, config: dict[str, Any], run_id: str) -> None:
        import wandb

        self._run = wandb.init(project=project, dir=str(run_dir), mode="offline", config=config, id=run_id,
                               resume="allow", name=Path(run_dir).name)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=step)

    def close(self) -> None:
        self._run.finish()


def build_sinks(report: ReportConfig, run_dir: Path, *, config: dict[str, Any] | None = None, run_id: str = "",
                resume_step: int | None = None) -> list[Sink]:
    """The sinks ``report`` names; on resume TensorBoard drops events after ``resume_step``."""
    sinks: list[Sink] = []
    for target in report.targets():
        if target == "tensorboard":
            sinks.append(TensorBoardSink(Path(run_dir), purge_step=None if resume_step is None else resume_step + 1))
        elif target == "wandb":
            sinks.append(WandbSink(Path(run_dir), report.wandb_project, config or {}, run_id or Path(run_dir).name))
    return sinks
