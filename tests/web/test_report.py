"""``swarm-learner report RUN_DIR``: the static HTML report of a finished run."""

from __future__ import annotations

import json
import re

import pytest

from learner.cli import main
from learner.config import LearnerConfig
from learner.metrics import MetricsWriter
from learner.report import report_snapshot, write_report
from swarm.config import dump_toml, to_dict, with_values
from web_fixtures import PEER_A, PEER_B, metrics_rows


def make_run(run_dir, steps=6):
    run_dir.mkdir()
    cfg = with_values(LearnerConfig(), {"train.steps": steps, "task.name": "arith"})
    (run_dir / "config.toml").write_text(dump_toml(to_dict(cfg)))
    writer = MetricsWriter(run_dir)
    for row in metrics_rows(steps):
        writer.write(row)
    (run_dir / "swarm.json").write_text(json.dumps({"nodes": {
        PEER_A: {"backend": "llamacpp", "device": "cpu", "tokens_per_s": 150.0, "memory_bytes": 1, "groups": 5,
                 "completions": 40, "rejected_groups": 1, "gen_s": 10.0, "gen_tokens": 1500},
        PEER_B: {"backend": "mlx", "device": "cpu", "tokens_per_s": 12.0, "memory_bytes": 1, "groups": 1,
                 "completions": 8, "rejected_groups": 0, "gen_s": 0.0, "gen_tokens": 0,
                 "link_role": "leaf", "link_why": "every hole punch failed (symmetric NAT likely)"}}}))
    (run_dir / "ledger.json").write_text(json.dumps({"trained": 12, "dropped:stale": 2}))
    return run_dir


def test_report_has_charts_nodes_ledger_and_config(tmp_path):
    run = make_run(tmp_path / "run")
    out = write_report(run)
    assert out == run / "report.html"
    html = out.read_text()
    assert len(re.findall(r'<circle class="pt" data-series="reward"', html)) == 6
    assert 'id="step-now">6<' in html and 'data-backend="mlx"' in html and 'data-backend="llamacpp"' in html
    assert "stale: 2" in html and "[train]" in html
    assert "<script>" not in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    island = re.search(r'<script type="application/json" id="snapshot">(.*?)</script>', html, re.S).group(1)
    assert json.loads(island)["status"]["steps"] == 6
    rows = {r["peer_id"]: r for r in json.loads(island)["nodes"]}
    assert rows[PEER_B]["link"] == "leaf" and "symmetric NAT" in rows[PEER_B]["link_why"]  # as the live page
    assert "link" not in rows[PEER_A]


def test_report_snapshot_tolerates_missing_optional_files(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    MetricsWriter(run).write(metrics_rows(1)[0])
    snap = report_snapshot(run)
    assert snap["nodes"] == [] and snap["ledger"]["total"] == 0 and snap["status"]["step"] == 1


def test_report_command(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    assert main(["report", str(run), "--out", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").exists() and "report written" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "metrics.jsonl not found" in capsys.readouterr().err


def test_bad_metrics_line_is_a_clear_error(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1\n{"step": 2}\n')  # a torn line that is not the last
    with pytest.raises(ValueError, match="not valid JSON"):
        report_snapshot(run)
