"""--report-to: the rows of metrics.jsonl also as TensorBoard scalars, read back from the event files."""

from __future__ import annotations

import json

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


def test_wandb_mode_follows_wandb_mode_then_a_configured_key():
    from learner.report_to import wandb_mode

    assert wandb_mode({}) == "offline"
    assert wandb_mode({"WANDB_API_KEY": "fake-key"}) == "online"
    assert wandb_mode({"WANDB_API_KEY": "fake-key", "WANDB_MODE": "offline"}) == "offline"
    assert wandb_mode({"WANDB_MODE": "Disabled"}) == "disabled"
    assert wandb_mode({}, ["api.wandb.ai"]) == "online"  # `wandb login` wrote ~/.netrc
    assert wandb_mode({"WANDB_BASE_URL": "https://wandb.example.org:8443"}, ["api.wandb.ai"]) == "offline"
    assert wandb_mode({"WANDB_BASE_URL": "https://wandb.example.org:8443"}, ["wandb.example.org"]) == "online"


def test_netrc_hosts_read_the_users_file(tmp_path):
    from learner.report_to import netrc_hosts

    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password fake-key\n")
    assert netrc_hosts({"NETRC": str(tmp_path / "netrc")}) == ["api.wandb.ai"]
    assert netrc_hosts({"NETRC": str(tmp_path / "none")}) == []


def test_a_bad_wandb_mode_is_a_config_error(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    with pytest.raises(ConfigError, match="WANDB_MODE='sometimes'"):
        ReportConfig(to=["wandb"])
    ReportConfig(to=["tensorboard"])  # only W&B cares


def test_wandb_offline_with_a_fake_key_logs_rows_and_tables_locally(tmp_path, monkeypatch):
    """WANDB_MODE=offline wins over a configured (fake) key: nothing leaves the machine, the run's
    rows and a completions table land in the offline run under run_dir/wandb."""
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    sinks = build_sinks(ReportConfig(to=["wandb"]), tmp_path, config={"train": {"steps": 2}}, run_id="abc123")
    assert [s.mode for s in sinks] == ["offline"]
    w = MetricsWriter(tmp_path, sinks=sinks)
    w.write({"step": 1, "reward_mean": 0.25})
    w.write_table(1, "completions", ["step", "completion", "reward"], [[1, "2 + 2 = 4", 1.0]])
    w.write({"step": 2, "reward_mean": 0.5})
    w.close()
    assert w.sinks == []  # closed, none dropped by a failure
    runs = list((tmp_path / "wandb").glob("offline-run-*-abc123"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    table = list(runs[0].glob("files/media/table/completions_1_*.table.json"))
    assert table and json.loads(table[0].read_text())["data"] == [[1, "2 + 2 = 4", 1.0]]


def test_wandb_disabled_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    w = MetricsWriter(tmp_path, sinks=build_sinks(ReportConfig(to=["wandb"]), tmp_path, run_id="abc123"))
    w.write({"step": 1, "reward_mean": 0.25})
    w.write_table(1, "completions", ["step"], [[1]])
    w.close()
    assert not list((tmp_path / "wandb").glob("*run-*")) and len(w.rows) == 1
