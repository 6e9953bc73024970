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

import importlib.util
import math
import netrc
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from swarm.config import ConfigError

TARGETS = ("tensorboard", "wandb")
"""What ``report.to`` may name."""
WANDB_MODES = ("online", "offline", "disabled", "dryrun", "shared")
"""The values of ``WANDB_MODE`` the W&B client accepts."""
WANDB_HOST = "api.wandb.ai"
"""The W&B host whose ``~/.netrc`` entry counts as a configured key (``WANDB_BASE_URL`` overrides it)."""


@dataclass
class ReportConfig:
    """``[report]``: figures beside ``metrics.jsonl`` for the tools users already watch."""

    #: Where to send each step's figures besides ``metrics.jsonl``: ``tensorboard`` (event files
    #: in the run directory), ``wandb`` (online when a key is configured, else offline; ``WANDB_MODE``
    #: decides when set; needs the wandb package). Repeat ``--report-to`` or give a comma-separated list.
    to: list[str] = field(default_factory=list)
    #: W&B project name of the run.
    wandb_project: str = "echo-swarm"
    #: Log a table of sampled completions with their rewards every this many steps (0 = never;
    #: TRL's ``log_completions``): ``completions.jsonl``, TensorBoard text, a W&B table, the dashboard.
    completions_every: int = 1
    #: Completions in each table, taken in turn from the step's prompt groups.
    completions: int = 8

    def targets(self) -> list[str]:
        """``to`` with comma-separated entries split, duplicates and ``none`` dropped."""
        out: list[str] = []
        for item in self.to:
            for t in str(item).split(","):
                t = t.strip().lower()
                if t and t != "none" and t not in out:
                    out.append(t)
        return out

    def validate(self) -> None:
        bad = [t for t in self.targets() if t not in TARGETS]
        if bad:
            raise ConfigError(f"report.to: unknown target(s) {bad}; use {', '.join(TARGETS)}")
        if "wandb" in self.targets() and importlib.util.find_spec("wandb") is None:
            raise ConfigError("report.to: wandb needs the wandb package (pip install 'echo-swarm[wandb]')")
        mode = os.environ.get("WANDB_MODE", "").strip().lower()
        if "wandb" in self.targets() and mode and mode not in WANDB_MODES:
            raise ConfigError(f"report.to: WANDB_MODE={mode!r} is not one of {', '.join(WANDB_MODES)}")
        if self.completions_every < 0 or self.completions < 0:
            raise ConfigError("report.completions_every and report.completions must be >= 0")
        if "tensorboard" in self.targets() and importlib.util.find_spec("tensorboard") is None:
            raise ConfigError("report.to: tensorboard needs the tensorboard package (pip install tensorboard)")


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
        self._run = wandb.init(project=project, dir=str(run_dir), mode=mode, config=config, id=run_id,
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
