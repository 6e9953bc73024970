"""Where else the run's figures go: TensorBoard event files and Weights & Biases.

``--report-to tensorboard`` (``[report] to = ["tensorboard"]``) writes TensorBoard event files
into the run directory, beside ``metrics.jsonl``, so ``tensorboard --logdir runs/`` shows every
run. ``wandb`` logs to a W&B run (files under ``<run_dir>/wandb``) and needs the ``wandb``
package; naming it without the package is a config error. The W&B mode is ``WANDB_MODE`` when
set (``online``, ``offline``, ``disabled``, ...), else ``online`` when an API key is configured
(``WANDB_API_KEY``, or a ``~/.netrc`` entry for the W&B host as ``wandb login`` writes it), else
``offline`` (upload later with ``wandb sync``): :func:`wandb_mode`.

Each sink gets exactly the rows of ``metrics.jsonl``: every numeric field as a scalar at the
row's ``step``, nested maps flattened to ``name/key`` (e.g. ``nodes/<peer>``, ``dropped/stale``);
text, lists and non-finite values are left out. Tables (the sampled completions,
``learner/watch.py``) go to TensorBoard as a Markdown text at their step and to W&B as a
``wandb.Table``.
"""

from __future__ import annotations

import math
import netrc
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from learner.config import REPORT_TARGETS as TARGETS, WANDB_MODES, ReportConfig  # noqa: F401 (re-exported)

WANDB_HOST = "api.wandb.ai"
"""The W&B host whose ``~/.netrc`` entry counts as a configured key (``WANDB_BASE_URL`` overrides it)."""


class Sink(Protocol):
    def write(self, step: int, scalars: dict[str, float]) -> None: ...

    def table(self, step: int, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None: ...

    def close(self) -> None: ...


def wandb_mode(env: Mapping[str, str], netrc_hosts: Sequence[str] = ()) -> str:
    """The W&B mode (pure): ``WANDB_MODE`` when set; ``online`` when a key is configured
    (``WANDB_API_KEY``, or ``netrc_hosts``, the machines of the user's netrc file, holds the W&B
    host of ``WANDB_BASE_URL``, default :data:`WANDB_HOST`); else ``offline``."""
    mode = env.get("WANDB_MODE", "").strip().lower()
    if mode:
        return mode
    if env.get("WANDB_API_KEY", "").strip():
        return "online"
    base = env.get("WANDB_BASE_URL", "").strip()
    host = base.split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0] if base else WANDB_HOST
    return "online" if host in netrc_hosts else "offline"


def netrc_hosts(env: Mapping[str, str]) -> list[str]:
    """The machines of the user's netrc file (``NETRC`` or ``~/.netrc``; none when unreadable)."""
    path = env.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        return list(netrc.netrc(path).hosts)
    except (OSError, netrc.NetrcParseError):
        return []


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (TensorBoard renders its text summaries as Markdown); pure."""
    def cell(v: Any) -> str:
        text = f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", "").replace("\n", "<br>")

    lines = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


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

    def table(self, step: int, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self._writer.add_text(name, markdown_table(columns, rows), global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """A W&B run under ``run_dir/wandb`` in ``mode`` (:func:`wandb_mode`), resumed by id on ``--resume``."""

    def __init__(self, run_dir: Path, project: str, config: dict[str, Any], run_id: str, mode: str) -> None:
        import wandb

        self._wandb = wandb
        self.mode = mode
        self._run = wandb.init(project=project, dir=str(run_dir), mode=mode,  # type: ignore[arg-type]  # a WANDB_MODES value
                               config=config, id=run_id,
                               resume="allow", name=Path(run_dir).name)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=step)

    def table(self, step: int, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self._run.log({name: self._wandb.Table(columns=list(columns), data=[list(r) for r in rows])}, step=step)

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
            env = dict(os.environ)
            sinks.append(WandbSink(Path(run_dir), report.wandb_project, config or {}, run_id or Path(run_dir).name,
                                   mode=wandb_mode(env, netrc_hosts(env))))
    return sinks
