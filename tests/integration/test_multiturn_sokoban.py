"""Multi-turn Sokoban through the swarm: an in-process learner and one real ``swarm-node``
process (llama.cpp) over libp2p on 127.0.0.1, one learner step."""

from __future__ import annotations

import subprocess

import pytest
import trio

from learner.config import LearnerConfig
from learner.demo import node_command, stop_processes
from learner.loop import run_learner
from learner.metrics import read_metrics
from swarm.config import load_config
from tasks.episode_tokens import mask_runs

pytestmark = pytest.mark.integration


def test_one_multi_turn_sokoban_step_through_a_real_node(tmp_path):
    cfg = load_config(LearnerConfig, None, [
        'network.listen="/ip4/127.0.0.1/tcp/0"',  # not the launch default 0.0.0.0:4001
        'task.name="sokoban"', "task.multi_turn=true", "task.max_turns=2",
        "train.steps=1", "train.prompts_per_step=1", "train.group_size=2", "train.max_tokens=8",
        "train.micro_batch=2", "train.checkpoint_every=0", "sync.long_poll_s=1.0", 'dissem.mode="direct"',
    ])
    procs: list[subprocess.Popen] = []
    seen: dict = {"verified": []}

    def on_service(svc) -> None:
        seen["svc"] = svc
        real = svc.coordinator.verify

        def spy(spec, result):
            reason = real(spec, result)
            seen["verified"].append((result, reason))
            return reason
        svc.coordinator.verify = spy

    async def main():
        with trio.fail_after(300):
            async with trio.open_nursery() as nursery:
                addrs = await nursery.start(lambda task_status: run_learner(
                    cfg, tmp_path / "run", console=lambda s: None, on_service=on_service, task_status=task_status))
                log = open(tmp_path / "node.log", "w")
                cmd = node_command(addrs[0], tmp_path / "node", 1, "n0", "default") + ["--no-probe", "-v"]
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))

    try:
        trio.run(main)
    finally:
        stop_processes(procs, 20)
    node_log = (tmp_path / "node.log").read_text()
    (row,) = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert row["samples"] == 2 and 0.0 <= row["reward_mean"] <= 1.0 and row["policy_version"] == 1, node_log
    assert seen["svc"].coordinator.counts() == {"trained": 1}
    (result, reason), = seen["verified"]  # the one group, replayed by the learner and accepted
    assert reason is None and result.version == 0
    for c in result.completions:
        runs = mask_runs(c.mask)
        assert runs[0][0] == 1 and runs[-1][0] == 1 and sum(v for v, _, _ in runs) <= 2
        assert all(lp == 0.0 for lp, m in zip(c.logprobs, c.mask) if not m)
    # eight tokens rarely solve a level in one turn: the environment replied at least once
    assert any(len(mask_runs(c.mask)) == 3 for c in result.completions)
    assert row["train_tokens"] == sum(sum(c.mask) for c in result.completions)
    assert "v0 lease" in node_log and procs[0].returncode == 0, node_log
