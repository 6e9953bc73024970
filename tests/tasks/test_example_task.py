"""examples/my_task.py: a task written outside the package, loaded by path and trained as is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tasks.interface import SingleTurnTask
from tasks.registry import make_task

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "examples/my_task.py:make"


def test_the_example_meets_the_interface(monkeypatch):
    monkeypatch.chdir(ROOT)
    task = make_task(SimpleNamespace(name=EXAMPLE, seed=1, options={"max_value": 60}))
    assert isinstance(task, SingleTurnTask) and task.name == "next-number"
    train = {task.problem("train", i).question for i in range(200)}
    ev = {task.problem("eval", i).question for i in range(100)}
    assert train and ev and not (train & ev)
    p = task.problem("eval", 0)
    assert task.reward(p, f"{p.answer}") == 1.0 and task.reward(p, f"It is {p.answer}.") == 1.0
    assert task.reward(p, "no idea") == 0.0 and task.reward(p, "") == 0.0


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(3000)
def test_swarm_learner_demo_trains_the_example_and_tensorboard_has_its_rewards(tmp_path):
    """``swarm-learner demo --task examples/my_task.py:make --steps 5 --report-to tensorboard``: a
    learner and two swarm-node processes over libp2p; the event files hold the reward of each step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "learner.cli", "demo", "--task", EXAMPLE, "--steps", "5", "--no-dashboard",
           "--report-to", "tensorboard", "--run-dir", str(run_dir),
           "--set", "train.prompts_per_step=4", "--set", "train.group_size=4", "--set", "train.max_tokens=8"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=2900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert all(r["samples"] == 4 * 4 for r in rows)
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    tb = [(e.step, round(e.value, 6)) for e in acc.Scalars("reward_mean")]
    assert tb == [(r["step"], round(r["reward_mean"], 6)) for r in rows]
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
