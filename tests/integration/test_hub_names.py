"""Models and datasets by Hugging Face Hub name, with the network off: a Hub cache in
huggingface_hub's own layout holds a tiny random Qwen3 (``bench.make_model``) and a dataset of
JSONL splits; ``swarm-learner demo --set model.name=org/name --set task.options.path=org/data``
resolves both from the cache (``HF_HUB_OFFLINE=1``, and an unreachable endpoint), serves the model
to a real ``swarm-node`` (which converts it for llama.cpp) and trains one step; a revision that is
not in the cache is a clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.make_model import make_model
from tests.hub_cache import put_repo

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    model = make_model("qwen3", root / "made", "tiny", seed=0)
    cache = root / "hub"
    commit = put_repo(cache, "model", "echo-test/tiny-qwen3", {p.name: p for p in sorted(model.iterdir())})
    rows = [json.dumps({"prompt": f"What is {i} + 1?", "answer": str(i + 1), "source": "gen"}) for i in range(24)]
    data_commit = put_repo(cache, "dataset", "echo-test/sums", {
        "data/train.jsonl": ("\n".join(rows[:20]) + "\n").encode(),
        "data/test.jsonl": ("\n".join(rows[20:]) + "\n").encode()})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(root / "datasets"), "HF_ENDPOINT": "http://127.0.0.1:9",
           "ECHO_SWARM_CACHE": str(root / "echo-cache")}
    return {"env": env, "commit": commit, "data_commit": data_commit, "root": root}


def demo(hub, run_dir: Path, *sets: str, steps: int = 1) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "learner.cli", "demo", "--nodes", "1", "--steps", str(steps), "--no-dashboard",
           "--run-dir", str(run_dir), "--task", "data",
           "--set", "train.prompts_per_step=2", "--set", "train.group_size=2", "--set", "train.max_tokens=6",
           "--set", "verify.enabled=false"]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, cwd=run_dir.parent, capture_output=True, text=True, timeout=1400, env=hub["env"])


@pytest.mark.slow  # 59 s to make the model and 206 s to train at load 20; run by make test-slow
@pytest.mark.timeout(1500)
def test_a_hub_model_and_dataset_train_a_step_offline(hub, tmp_path):
    proc = demo(hub, tmp_path / "run", 'model.name="echo-test/tiny-qwen3"', f'model.revision="{hub["commit"]}"',
                'task.options.path="echo-test/sums"', 'task.options.eval_split="test"',
                f'task.options.revision="{hub["data_commit"]}"')
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if line]
    assert [r["step"] for r in rows] == [1] and rows[0]["samples"] == 4, out[-4000:]
    assert "echo-test/tiny-qwen3" in out  # the learner names the model by its Hub name
    node_logs = "".join(p.read_text() for p in (tmp_path / "run" / "nodes").glob("*.log"))
    assert "convert" in node_logs or "gguf" in node_logs.lower(), node_logs[-3000:]


@pytest.mark.timeout(900)
def test_an_uncached_revision_is_a_clear_error(tmp_path):
    cache = tmp_path / "hub"
    put_repo(cache, "model", "echo-test/tiny-qwen3", {"config.json": b'{"model_type": "qwen3"}'})
    hub = {"env": {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
                   "HF_ENDPOINT": "http://127.0.0.1:9", "HF_DATASETS_CACHE": str(tmp_path / "datasets")}}
    proc = demo(hub, tmp_path / "run", 'model.name="echo-test/tiny-qwen3"', 'model.revision="v9"')
    assert proc.returncode != 0
    assert "echo-test/tiny-qwen3" in proc.stderr and "revision v9" in proc.stderr and "HF_HUB_OFFLINE" in proc.stderr, \
        proc.stderr[-3000:]
    proc = demo(hub, tmp_path / "run2", 'task.options.path="echo-test/nope"')
    assert proc.returncode == 2 and "Hub dataset 'echo-test/nope'" in proc.stderr, proc.stderr[-3000:]
