"""Rewards and environments as TRL and verifiers write them, trained through the swarm: an
in-process learner and a real ``swarm-node`` process (llama.cpp) over libp2p on 127.0.0.1.

- a data file scored by a TRL batch-form reward and a verifiers keyword-form reward, weighted;
- a verifiers (0.4) multi-turn environment, its ``Env.run`` the environment on the node and
  replayed by the learner;
- a reward with a wrong signature stops ``swarm-learner demo`` before any node starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from learner.config import LearnerConfig
from swarm.config import load_config
from tests.integration.learner_nodes import Node
from tests.integration.learner_nodes import run as run_with_nodes

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

ROWS = [{"question": f"What is {a} + {b}?", "answer": str(a + b), "difficulty": a % 3}
        for a in range(1, 8) for b in range(1, 5)]

TRL_REWARDS = '''
import json, os

LOG = os.environ["ECHO_RW_LOG"]

def numbers_reward(completions, prompts, completion_ids, difficulty, **kwargs):
    """TRL batch form: one call per group, columns as lists."""
    with open(LOG, "a") as f:
        f.write(json.dumps({"fn": "batch", "n": len(completions), "prompts": len(set(prompts)),
                            "ids": [len(i) for i in completion_ids], "difficulty": difficulty,
                            "kwargs": sorted(kwargs)}) + "\\n")
    return [1.0 if any(ch.isdigit() for ch in c) else -1.0 for c in completions]

def exact_reward(completion, answer):
    """verifiers keyword form: one call per completion."""
    with open(LOG, "a") as f:
        f.write(json.dumps({"fn": "keyword", "answer": answer}) + "\\n")
    return 1.0 if completion.strip().endswith(answer) else 0.0
'''

GAME = '''
import verifiers.v1 as vf

class GuessData(vf.TaskData):
    answer: str

class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=0.5)
    async def has_number(self, trace) -> float:
        return 1.0 if any(ch.isdigit() for ch in trace.last_reply) else 0.0

class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self):
        for i in range(12):
            yield GuessTask(GuessData(prompt=f"Guess my number from 1 to 9. Reply with one number. ({i})",
                                      system_prompt="You play a guessing game.", answer=str(i % 9 + 1)),
                            self.config.task)

class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()

class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        target = int(task.data.answer)
        async with agents.player.interaction(task) as it:
            seg = await it.turn()
            while not seg.terminated:
                digits = [int(c) for c in seg.last_reply if c.isdigit()]
                if digits and digits[-1] == target:
                    it.trace.record_reward("won", 1.0)
                    break
                seg = await it.turn("Higher." if digits and digits[-1] < target else "Lower.")

__all__ = ["GuessTaskset", "GuessEnv"]
'''

BASE = ['network.listen="/ip4/127.0.0.1/tcp/0"', "train.steps=2", "train.prompts_per_step=2", "train.group_size=2",
        "train.micro_batch=4", "train.checkpoint_every=0", "sync.long_poll_s=1.0", 'dissem.mode="direct"',
        "dashboard.enabled=false", "verify.enabled=false"]


def write_rows(path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


@pytest.mark.timeout(1500)  # about a minute on an idle machine; the limit covers a loaded one
def test_a_trl_and_a_verifiers_style_reward_train_two_steps(tmp_path, monkeypatch):
    (tmp_path / "echo_it_rewards.py").write_text(TRL_REWARDS)
    log = tmp_path / "calls.jsonl"
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ECHO_RW_LOG", str(log))
    data = write_rows(tmp_path / "sums.jsonl")
    cfg = load_config(LearnerConfig, None, BASE + [
        'task.name="data"', f'task.options.path="{data}"', 'task.options.prompt_column="question"',
        'task.options.reward=["echo_it_rewards:numbers_reward", "echo_it_rewards:exact_reward"]',
        "task.options.reward_weights=[0.5, 2.0]", "train.max_tokens=12"])
    out = run_with_nodes(tmp_path, cfg, [Node("n0", threads=2)], 1400)
    rows = out["rows"]
    assert [r["step"] for r in rows] == [1, 2] and all(r["samples"] == 4 for r in rows), out["logs"]["n0"]
    assert all(r["reward_errors"] == 0 for r in rows)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    batch = [c for c in calls if c["fn"] == "batch"]
    # one validation call at build (one completion), then one call per trained group of 2
    assert batch[0]["n"] == 1 and len(batch) >= 1 + 4
    trained = batch[-4:]
    assert all(c["n"] == 2 and c["prompts"] == 1 and len(set(c["difficulty"])) == 1 for c in trained)
    assert all(min(c["ids"]) >= 1 for c in trained)  # the completion token ids, as TRL passes them
    assert {"trainer_state", "log_extra", "log_metric", "answer", "question"} <= set(trained[0]["kwargs"])
    assert sum(c["fn"] == "keyword" for c in calls) >= 1 + 8
    for r in rows:  # each reward is 0.5 * (+-1) + 2 * (0 or 1): the mean lies in [-0.5, 2.5]
        assert -0.5 <= r["reward_mean"] <= 2.5


@pytest.mark.slow  # two multi-turn steps: 11 min at load 20 (337 s a step); run by make test-slow
@pytest.mark.timeout(1500)
def test_a_verifiers_environment_trains_two_steps(tmp_path, monkeypatch):
    (tmp_path / "echo_it_game.py").write_text(GAME)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cfg = load_config(LearnerConfig, None, BASE + [
        'task.name="vf:echo_it_game"', "task.multi_turn=true", "task.max_turns=2", "train.max_tokens=6"])
    out = run_with_nodes(tmp_path, cfg, [Node("n0", threads=2)], 1400)
    rows, node_log = out["rows"], out["logs"]["n0"]
    assert [r["step"] for r in rows] == [1, 2] and all(r["samples"] == 4 for r in rows), node_log
    assert all(r["reward_errors"] == 0 for r in rows), rows
    assert "v0 lease" in node_log and out["procs"][0].returncode == 0, node_log
    assert out["svc"].coordinator.counts() == {"trained": 4}
    assert all(r["train_tokens"] > 0 for r in rows)


def test_a_wrong_reward_signature_stops_the_learner_before_any_node_starts(tmp_path):
    (tmp_path / "echo_bad_reward.py").write_text("def score(text):\n    return 1.0\n")
    data = write_rows(tmp_path / "sums.jsonl")
    config = tmp_path / "bad.toml"
    config.write_text(f'[task]\nname = "data"\noptions = {{ path = "{data}", prompt_column = "question", '
                      'reward = "echo_bad_reward.py:score" }\n')
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "learner.cli", "demo", "--nodes", "1", "--config", str(config),
                           "--no-dashboard", "--run-dir", str(run_dir)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert ("config error: reward 'echo_bad_reward.py:score' (keyword form) requires parameter(s) ['text']"
            in proc.stderr), proc.stderr
    assert "TRL's batch form, f(completions, **kwargs)" in proc.stderr and "verifiers' keyword form" in proc.stderr
    assert "swarm-node" not in proc.stdout and not run_dir.exists()  # no node was started, nothing leased
