"""A run directory is never reused silently (learner/run_dir.py, ``swarm-learner launch|demo``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from learner.run_dir import clear_outputs, holds_run, reuse_problem


def _old_run(d: Path) -> Path:
    (d / "checkpoints" / "step-3").mkdir(parents=True)
    (d / "identity").mkdir()
    (d / "identity" / "key").write_bytes(b"k")
    (d / "metrics.jsonl").write_text('{"step": 1}\n')
    (d / "summary.json").write_text("{}")
    return d


def test_a_fresh_or_empty_dir_is_free(tmp_path):
    assert reuse_problem(tmp_path / "new", resume=False, overwrite=False) is None
    (tmp_path / "metrics.jsonl").write_text("")  # an empty file is no run
    assert not holds_run(tmp_path)
    assert reuse_problem(tmp_path, resume=False, overwrite=False) is None


def test_a_dir_holding_a_run_needs_resume_or_overwrite(tmp_path):
    _old_run(tmp_path)
    assert holds_run(tmp_path)
    msg = reuse_problem(tmp_path, resume=False, overwrite=False)
    assert msg and "--resume" in msg and "--overwrite" in msg
    assert reuse_problem(tmp_path, resume=True, overwrite=False) is None
    assert reuse_problem(tmp_path, resume=False, overwrite=True) is None
    assert "contradict" in reuse_problem(tmp_path, resume=True, overwrite=True)


def test_checkpoints_alone_count_as_a_run(tmp_path):
    (tmp_path / "checkpoints" / "step-1").mkdir(parents=True)
    assert holds_run(tmp_path)


def test_resume_of_nothing_is_refused(tmp_path):
    assert "holds no run" in reuse_problem(tmp_path, resume=True, overwrite=False)


def test_overwrite_keeps_the_key_and_removes_the_rest(tmp_path):
    _old_run(tmp_path)
    removed = clear_outputs(tmp_path)
    assert sorted(removed) == ["checkpoints", "metrics.jsonl", "summary.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["identity"]
    assert (tmp_path / "identity" / "key").read_bytes() == b"k"


@pytest.mark.parametrize("command", [["launch", "--config", "configs/arith.toml"], ["demo"]])
def test_the_cli_refuses_before_loading_anything(tmp_path, command):
    run_dir = _old_run(tmp_path / "run")
    before = (run_dir / "metrics.jsonl").read_text()
    proc = subprocess.run([sys.executable, "-m", "learner.cli", *command, "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 2, proc.stderr
    assert "already holds a run" in proc.stderr and "--overwrite" in proc.stderr
    assert (run_dir / "metrics.jsonl").read_text() == before  # nothing truncated
