"""--report-to: the rows of metrics.jsonl also as TensorBoard scalars, read back from the event files."""

from __future__ import annotations

import pytest

from learner.config import LearnerConfig
from learner.metrics import MetricsWriter, read_metrics
from learner.config import ReportConfig
from learner.report_to import build_sinks, scalars_of
from swarm.config import ConfigError, load_config


def tensorboard_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in the event files of ``run_dir``: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_scalars_of_flattens_numbers_and_drops_the_rest():
    row = {"step": 3, "reward_mean": 0.5, "nodes": {"peerA": 8}, "dropped": {"stale": 2}, "mode": "x",
           "lst": [1], "nan": float("nan"), "none": None, "flag": True}
    assert scalars_of(row) == {"step": 3.0, "reward_mean": 0.5, "nodes/peerA": 8.0, "dropped/stale": 2.0, "flag": 1.0}


def test_tensorboard_event_files_hold_the_same_figures(tmp_path):
    w = MetricsWriter(tmp_path, sinks=build_sinks(ReportConfig(to=["tensorboard"]), tmp_path))
    rows = [{"step": s, "reward_mean": s / 10, "samples": 64, "nodes": {"abc": 32}} for s in range(1, 6)]
    for r in rows:
        w.write(r)
    w.close()
    tb = tensorboard_scalars(tmp_path)
    assert [(s, round(v, 6)) for s, v in tb["reward_mean"]] == [(r["step"], r["reward_mean"]) for r in read_metrics(tmp_path / "metrics.jsonl")]
    assert tb["nodes/abc"] == [(s, 32.0) for s in range(1, 6)]
    assert list(tmp_path.glob("events.out.tfevents.*"))


def test_a_failing_sink_is_dropped_not_fatal(tmp_path, caplog):
    class Broken:
        def write(self, step, scalars):
            raise OSError("disk full")

        def close(self):
            pass

    w = MetricsWriter(tmp_path, sinks=[Broken()])
    w.write({"step": 1, "reward_mean": 0.1})
    w.write({"step": 2, "reward_mean": 0.2})
    assert w.sinks == [] and "disk full" in caplog.text and len(w.rows) == 2


def test_config_and_flag(tmp_path):
    assert ReportConfig(to=["tensorboard,wandb", "none", "tensorboard"]).targets() == ["tensorboard", "wandb"]
    cfg = load_config(LearnerConfig, None, ['report.to=["tensorboard"]'])
    assert cfg.report.targets() == ["tensorboard"]
    with pytest.raises(ConfigError, match="unknown target"):
        load_config(LearnerConfig, None, ['report.to=["mlflow"]'])
    from learner.cli import REPORT_FLAGS, build_parser
    from swarm.config_flags import shortcut_overrides

    args = build_parser().parse_args(["demo", "--report-to", "tensorboard"])
    assert shortcut_overrides(args, REPORT_FLAGS) == ['report.to=["tensorboard"]']


def test_wandb_without_the_package_is_a_config_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match="wandb needs the wandb package"):
        ReportConfig(to=["wandb"])
