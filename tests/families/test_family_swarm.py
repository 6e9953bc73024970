"""A tiny random Qwen3 (an HF directory) trained by the learner with one ``swarm-node`` process per
backend over real libp2p on 127.0.0.1: the llama.cpp node fetches the GGUF the learner makes of
the directory (llama.cpp's converter), the MLX node converts it itself (mlx-lm), every step
trains on rollouts of all three, and the behaviour log-probs they report agree with the learner's
fp32 recomputation (``train.behaviour_check``). About a minute on an idle two-core machine,
several when it is busy, hence ``slow`` (``make test-slow``); ``docs/benchmarks.md`` reports the
same run through ``swarm-learner demo``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import trio

from learner.config import LearnerConfig
from learner.demo import node_command, stop_processes
from learner.loop import run_learner
from learner.metrics import read_metrics
from swarm.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BACKENDS = ("llamacpp", "torch", "mlx")
#: Most mean |behaviour - learner| log-prob per token: llama.cpp runs the F16 GGUF the learner makes
#: of an HF directory by default (``--quant keep``; measured 2e-3 to 3e-3); torch and MLX run
#: fp32 (measured below 2e-6).
MAX_DIFF = {"llamacpp": 0.02, "torch": 1e-4, "mlx": 1e-4}


@pytest.mark.timeout(1500)
def test_qwen3_hf_directory_on_every_backend(tmp_path: Path):
    from bench.make_model import make_model

    model = make_model("qwen3", tmp_path / "qwen3-tiny", "tiny", seed=2)
    cfg = load_config(LearnerConfig, None, [
        'network.listen="/ip4/127.0.0.1/tcp/0"', f'model.name="{model}"',
        "train.steps=2", "train.prompts_per_step=3", "train.group_size=2", "train.max_tokens=12",
        "train.micro_batch=6", "train.checkpoint_every=0", "train.behaviour_check=true", "sync.long_poll_s=5.0",
        f"sync.min_waiting_nodes={len(BACKENDS)}",
    ])
    procs: list[subprocess.Popen] = []
    seen: dict = {}

    def on_service(svc) -> None:
        seen["svc"] = svc

    async def main():
        async with trio.open_nursery() as nursery:
            addrs = await nursery.start(lambda task_status: run_learner(
                cfg, tmp_path / "run", console=lambda s: None, on_service=on_service, task_status=task_status))
            for b in BACKENDS:
                log = open(tmp_path / f"{b}.log", "w")
                cmd = node_command(addrs[0], tmp_path / b, 1, b, str(model), b)
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))

    async def bounded():
        with trio.fail_after(1200):
            await main()

    try:
        trio.run(bounded)
    finally:
        stop_processes(procs, 20)
    logs = "".join(f"--- {b}\n" + (tmp_path / f"{b}.log").read_text()[-3000:] for b in BACKENDS)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2], logs
    backends = seen["svc"].node_backends()
    assert sorted(backends.values()) == sorted(BACKENDS), backends
    for b in BACKENDS:
        diffs = [r[f"behav_diff_{b}"] for r in rows if f"behav_diff_{b}" in r]
        assert diffs, (b, "no rollouts of this backend were trained on", logs)
        print(f"{b}: mean |behaviour - learner| per step {diffs}")
        assert max(diffs) < MAX_DIFF[b], (b, diffs)
