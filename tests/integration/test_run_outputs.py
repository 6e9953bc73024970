"""The default demo's outputs, through ``swarm-learner demo``'s own harness (``run_demo``: the
learner in this process, a real ``swarm-node`` process over libp2p, llama.cpp) with few steps: the
sampled completions, the held-out curve in metrics.jsonl, eval.jsonl, TensorBoard and the live
dashboard, peft adapters every step, and learner.log."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest

from learner.config import LearnerConfig
from learner.demo import run_demo
from learner.metrics import read_metrics
from swarm.config import load_config
from tasks.arith import ArithTask

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DashboardWatcher(threading.Thread):
    """Reads the live dashboard once a second while the demo runs; keeps the newest ``/api/watch``
    and page that show a held-out point."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop, self.watch, self.page = url, threading.Event(), None, ""

    def run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self.stop.wait(1.0):
                try:
                    watch = client.get(self.url + "api/watch").json()
                    if watch and watch["evals"]:
                        self.watch, self.page = watch, client.get(self.url).text
                except httpx.HTTPError:
                    continue  # not listening yet, or gone


def test_demo_writes_completions_the_heldout_curve_adapters_and_its_log(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    port = free_port()
    cfg = load_config(LearnerConfig, None, [
        "train.steps=2", "train.prompts_per_step=2", "train.group_size=2", "train.max_tokens=12", "train.micro_batch=4",
        "train.checkpoint_every=0", "train.adapter_every=1", "sync.long_poll_s=1.0", "eval.every=2", "eval.n=2",
        "eval.samples=2", "report.completions=3", 'report.to=["tensorboard"]', f'dashboard.listen="127.0.0.1:{port}"',
        "dashboard.min_update_s=0.2", "verify.enabled=false", "train.torch_threads=1"])
    watcher = DashboardWatcher(f"http://127.0.0.1:{port}/")
    watcher.start()
    run = tmp_path / "run"
    try:
        assert run_demo(cfg, 1, run, node_threads=[1]) == 0
    finally:
        watcher.stop.set()
        watcher.join(10)

    # the held-out curve: before the first step and after the last, in every place it is shown
    evals = [json.loads(x) for x in (run / "eval.jsonl").read_text().splitlines()]
    assert [(e["step"], e["version"], e["n"]) for e in evals] == [(0, 0, 2), (2, 2, 2)]
    rows = read_metrics(run / "metrics.jsonl")
    assert "eval_accuracy" not in rows[0] and rows[1]["eval_accuracy"] == evals[1]["accuracy"]
    assert rows[1]["eval_n"] == 2 and rows[1]["eval_s"] > 0
    acc = EventAccumulator(str(run), size_guidance={"tensors": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("eval_accuracy")] == [(e["step"], e["accuracy"]) for e in evals]
    assert [e.step for e in acc.Tensors("completions/text_summary")] == [1, 2]
    assert watcher.watch is not None, "the dashboard never showed a held-out point"
    assert [e["step"] for e in watcher.watch["evals"]][0] == 0
    assert 'id="heldout-chart"' in watcher.page and 'id="samples"' in watcher.page
    assert len(json.loads((run / "summary.json").read_text())["heldout"]) == 3

    # sampled completions with the rewards the learner recomputed
    task = ArithTask(seed=0)
    recs = [json.loads(x) for x in (run / "completions.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 1, 1, 2, 2, 2]
    for r in train:
        problem = task.problem("train", int(r["group"][1:]))
        assert r["question"] == problem.question and r["reward"] == task.reward(problem, r["completion"])
        assert r["version"] == r["step"] - 1 and r["peer"] and r["advantage"] is not None
    assert [(r["step"], r["group"]) for r in recs if r["split"] == "eval"] == [(0, "eval-0"), (0, "eval-1"),
                                                                              (2, "eval-0"), (2, "eval-1")]

    # peft adapters every step beside the final one; the last equals the final adapter
    from safetensors.numpy import load_file

    for step in (1, 2):
        assert (run / "adapters" / f"step-{step}" / "adapter_config.json").is_file()
    last, final = (load_file(str(d / "adapter_model.safetensors"))
                   for d in (run / "adapters" / "step-2", run / "adapter"))
    assert last.keys() == final.keys() and all((last[k] == final[k]).all() for k in last)

    # the log file: the console lines, the held-out lines and the demo's summary
    log = (run / "learner.log").read_text()
    assert "learner: held-out eval at step 0 (v0)" in log and "step   2/2" in log
    assert "demo: held-out accuracy on 2 eval problems" in log and "demo: outputs in" in log
