"""``swarm-bench gpu-check --device cpu`` on a tiny random Qwen2.5 shape: every part runs in its own
process as on a GPU machine (the trainer at each precision setting, the torch node backend, a
learner and a torch node over libp2p, the learner under torchrun on one gloo rank), so that a
lent GPU's minutes go to measuring. The GPU figures themselves: ``docs/benchmarks.md``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cli import main

pytestmark = pytest.mark.integration  # 48 s on an idle 2-core machine

TINY = ["--device", "cpu", "--shapes", "qwen2-tiny", "--extra-shapes", "", "--parts", "trainer,node,swarm,torchrun",
        "--swarm-model", "qwen2-tiny", "--threads", "1", "--steps", "1", "--swarm-steps", "2", "--torchrun-steps", "1",
        "--prompts", "2", "--group", "2", "--prompt-len", "8", "--completion-len", "8", "--gen-group", "4",
        "--gen-tokens", "8", "--swarm-tokens", "8", "--budget-s", "500"]


@pytest.mark.timeout(600)
def test_gpu_check_on_the_cpu(tmp_path: Path):
    out = tmp_path / "out"
    try:
        main(["gpu-check", *TINY, "--out", str(out), "--work", str(tmp_path / "work")])
    except SystemExit as e:  # a failed part: show what the JSON says
        summary = (out / "gpu-check.json").read_text() if (out / "gpu-check.json").exists() else "no summary"
        pytest.fail(f"gpu-check exited {e.code}: {summary[-6000:]}")
    summary = json.loads((out / "gpu-check.json").read_text())
    parts = {p["part"]: p for p in summary["parts"]}
    assert list(parts) == ["trainer", "node", "swarm", "torchrun"]
    assert all(p["status"] == "ok" for p in parts.values()), parts
    assert summary["env"]["cuda_available"] is False and summary["env"]["libp2p"] != "not installed"

    rows = parts["trainer"]["rows"]
    assert [r["precision"] for r in rows] == ["auto", "bf16", "autocast", "fp32"]
    # `auto` is what this machine's CPU computes fastest (fp32 without native bf16): the learner's own choice
    from learner.placement import resolve_precision

    dtype, autocast, _ = resolve_precision("auto", "cpu")
    auto = f"{dtype}{' + bf16 autocast' if autocast else ''}"
    assert [r["resolved"] for r in rows] == [auto, "bfloat16 + bf16 autocast", "float32 + bf16 autocast", "float32"]
    for r in rows:
        assert r["finite"] and r["tokens_per_s"] > 0 and r["tokens_per_step"] == 2 * 2 * 16 and r["micro_batch"] >= 1
    assert parts["node"]["rows"][0]["tokens_per_s"] > 0 and parts["node"]["rows"][0]["backend"] == "torch"

    swarm, torchrun = parts["swarm"]["checks"], parts["torchrun"]["checks"]
    assert swarm["steps_trained"] == 2 and swarm["newest_version_generated"] == 1 and swarm["node_device"].startswith("cpu")
    assert torchrun["process_group"] and torchrun["learner_exit"] == 0 and torchrun["steps_trained"] == 1
    for name in ("trainer", "node", "swarm", "torchrun"):
        assert json.loads((out / f"{name}.json").read_text())["status"] == "ok"
