"""Run-directory outputs: ``metrics.jsonl`` (and its copies in TensorBoard / W&B, ``learner/report_to.py``),
the console progress line, ``reward.png``."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

log = logging.getLogger("echo_swarm.learner")

#: Window of the rolling mean reward shown on the console and used by the demo's summary.
ROLLING_WINDOW = 5


def rolling_mean(values: list[float], window: int = ROLLING_WINDOW) -> list[float]:
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


class MetricsWriter:
    """Appends one row per learner step. ``resume_step``: on resume, rows after this step (written
    after the checkpoint, before a crash) are cut off so that no step appears twice."""

    def __init__(self, run_dir: Path, resume: bool = False, resume_step: int | None = None, sinks: list | None = None):
        #: Also receive every row's numeric figures (``learner.report_to``: TensorBoard, W&B).
        self.sinks = list(sinks or [])
        self.path = Path(run_dir) / "metrics.jsonl"
        self.rows: list[dict[str, Any]] = read_metrics(self.path) if resume and self.path.exists() else []
        if not resume:
            self.path.write_text("")
        elif resume_step is not None and any(r.get("step", 0) > resume_step for r in self.rows):
            self.rows = [r for r in self.rows if r.get("step", 0) <= resume_step]
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r, allow_nan=False, default=_jsonable) + "\n" for r in self.rows))
            tmp.replace(self.path)

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row, allow_nan=False, default=_jsonable) + "\n")
        if self.sinks:
            from learner.report_to import scalars_of

            self.write_scalars(int(row.get("step", len(self.rows))), scalars_of(row))

    def write_scalars(self, step: int, scalars: dict[str, float]) -> None:
        """Figures that have no row of their own (the held-out score before the first step) to the sinks."""
        self._to_sinks(lambda sink: sink.write(step, scalars))

    def write_table(self, step: int, name: str, columns: list[str], rows: list[list[Any]]) -> None:
        """A table (``learner/watch.py``) to the sinks: TensorBoard text, a W&B table."""
        self._to_sinks(lambda sink: sink.table(step, name, columns, rows))

    def _to_sinks(self, call) -> None:
        for sink in list(self.sinks):
            try:
                call(sink)
            except Exception as e:  # a full disk or a broken sink must not stop training
                log.warning("metrics: %s failed (%r); it gets no more rows", type(sink).__name__, e)
                self.sinks.remove(sink)

    def close(self) -> None:
        """Close the sinks (metrics.jsonl is closed after every row)."""
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as e:
                log.warning("metrics: closing %s failed: %r", type(sink).__name__, e)
        self.sinks = []

    def rewards(self) -> list[float]:
        return [r["reward_mean"] for r in self.rows]


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl``; a torn last line (a crash mid-write) is skipped."""
    rows = []
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i != len(lines) - 1:
                raise
    return rows


def progress_line(row: dict[str, Any], steps: int, rolling: float) -> str:
    nodes = " ".join(f"{p[-6:]}:{n}" for p, n in sorted(row.get("nodes", {}).items()))
    dropped = sum(row.get("dropped", {}).values())
    extra = f" lag<={row['staleness_max']}" if row.get("staleness_max") else ""
    extra += f" dropped {dropped}" if dropped else ""
    return (
        f"step {row['step']:>3}/{steps} v{row['policy_version']:<3} reward {row['reward_mean']:.3f} "
        f"(rolling{ROLLING_WINDOW} {rolling:.3f}) samples {row['samples']:>3} "
        f"idle {row.get('learner_idle_s', 0.0):5.1f}s train {row['train_s']:5.1f}s clip {row.get('clip_frac', 0):.2f}"
        f"{extra} t={row['wall_s']:6.0f}s nodes {nodes}"
    )


def first_reaching(rows: list[dict[str, Any]], threshold: float, window: int = ROLLING_WINDOW) -> dict[str, Any] | None:
    """The first step whose rolling mean reward reaches ``threshold`` (with its wall time and samples)."""
    rolled = rolling_mean([r["reward_mean"] for r in rows], window)
    total = 0
    for row, value in zip(rows, rolled):
        total += row["samples"]
        if value >= threshold:
            return {"step": row["step"], "wall_s": row["wall_s"], "samples": total, "rolling": value}
    return None


def plot_rewards(rows: list[dict[str, Any]], out: Path, title: str = "reward") -> bool:
    """Draw ``reward.png``; False (with a warning) where matplotlib is not installed, e.g. a GPU
    server with only what training needs: the run's other outputs never depend on the plot."""
    try:
        import matplotlib
    except ImportError:
        log.warning("metrics: matplotlib is not installed; %s not drawn (metrics.jsonl has the figures)", out.name)
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    rewards = [r["reward_mean"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, rewards, "o-", alpha=0.5, label="mean reward per step")
    ax.plot(steps, rolling_mean(rewards), "-", lw=2, label=f"rolling mean ({ROLLING_WINDOW} steps)")
    ax.set_xlabel("learner step")
    ax.set_ylabel("reward")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return True
