"""Prediction against a (synthetic) measured run directory, and the CLI around it."""

from __future__ import annotations

import json

import pytest

from bench.capacity.validate import report, validate_run


def _run_dir(tmp_path, step_time=40.0, mode="async", S=2, nodes=None, rows=6):
    d = tmp_path / "run"
    d.mkdir()
    (d / "config.toml").write_text(f'[train]\nprompts_per_step = 8\ngroup_size = 8\nmax_tokens = 64\n'
                                   f'[sync]\nmode = "{mode}"\nmax_staleness = {S}\n')
    wall = 0.0
    lines = []
    for i in range(rows):
        wall += step_time
        lines.append(json.dumps({"step": i + 1, "wall_s": wall, "step_time_s": step_time, "train_s": 20.0,
                                 "learner_idle_s": step_time - 20.0, "samples": 64, "samples_per_s": 64 / step_time,
                                 "staleness_hist": {"0": 40, "1": 24}, "dropped": {"stale": 1}}))
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    nodes = nodes or {"peerAAAAAA": {"backend": "llamacpp", "device": "cpu", "tokens_per_s": 100.0, "groups": 24,
                                     "completions": 192, "gen_s": 240.0, "gen_tokens": 9000},
                      "peerBBBBBB": {"backend": "llamacpp", "device": "cpu", "tokens_per_s": 100.0, "groups": 24,
                                     "completions": 192, "gen_s": 240.0, "gen_tokens": 9000}}
    (d / "swarm.json").write_text(json.dumps({"nodes": nodes}))
    return d


def test_prediction_from_measured_node_rates(tmp_path):
    # two nodes at 10 s per group supply 0.2 groups/s; 8 groups per step -> 40 s steps, U = 0.5
    v = validate_run(_run_dir(tmp_path))
    assert v.prediction.utilisation == pytest.approx(0.5, rel=1e-4)
    assert v.measured_utilisation == pytest.approx(0.5)
    assert v.measured_samples_per_s == pytest.approx(64 / 40)
    assert v.util_error < 1e-3 and v.sps_error < 1e-3
    assert v.measured_staleness == {0: 200, 1: 120}
    text = report(v)
    assert "learner utilisation" in text and "ok" in text


def test_a_mismatch_is_reported_as_such(tmp_path):
    v = validate_run(_run_dir(tmp_path, step_time=25.0))  # measured faster than the nodes could supply
    assert v.util_error > 0.15
    assert "> 15%" in report(v)


def test_sequential_run(tmp_path):
    v = validate_run(_run_dir(tmp_path, mode="sequential", S=0))
    assert v.workload.mode == "sequential"
    assert v.prediction.step_s == pytest.approx(20.0 + 4 * 10.0)


def test_unusable_runs_give_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        validate_run(tmp_path)
    d = _run_dir(tmp_path, nodes={"p": {"backend": "x", "groups": 0, "gen_s": 0.0}})
    with pytest.raises(ValueError, match="no node"):
        validate_run(d)
    (d / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n" + json.dumps({"step": 2}) + "\n")
    with pytest.raises(ValueError, match="train_s"):
        validate_run(d)


def test_cli_validate(tmp_path, capsys):
    from bench.cli import main

    assert main(["capacity", "--validate", str(_run_dir(tmp_path))]) == 0
    assert "samples/s" in capsys.readouterr().out
