"""tasks/vf_env.py: verifiers 0.4 environments (``verifiers.v1``) as tasks, with real verifiers
tasksets, tasks, rewards and envs defined here (written as installed-style modules)."""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import pytest

from tasks.episode_tokens import replay_record
from tasks.interface import Segment, flatten_segments, is_env_task, run_episode
from tasks.plugins import parse_task_name
from tasks.registry import make_task

SINGLE = '''
import verifiers.v1 as vf

class SumData(vf.TaskData):
    answer: str

class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, task, trace) -> float:
        return 1.0 if trace.last_reply.endswith(task.answer) else 0.0

    @vf.reward(weight=0.5)
    async def brief(self, trace) -> float:
        return -1.0 if len(trace.last_reply) > 20 else 0.0

class SumConfig(vf.TasksetConfig):
    count: int = 24

class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self):
        for i in range(self.config.count):
            yield SumTask(SumData(prompt=f"What is {i} + 1?", system_prompt="Answer with a number.",
                                  answer=str(i + 1)), self.config.task)

__all__ = ["SumTaskset"]
'''

GAME = '''
import verifiers.v1 as vf

class GuessData(vf.TaskData):
    answer: str

class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=0.1)
    async def turns(self, trace) -> float:
        return -float(trace.num_turns)

class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self):
        for i in range(16):
            yield GuessTask(GuessData(prompt=f"Guess my number between 0 and 20 ({i}).", answer=str(i)),
                            self.config.task)

class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()

class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        target = int(task.data.answer)
        async with agents.player.interaction(task) as it:
            seg = await it.turn()
            while not seg.terminated:
                words = [w for w in seg.last_reply.replace(".", " ").split() if w.isdigit()]
                if words and int(words[-1]) == target:
                    it.trace.record_reward("won", 1.0)
                    break
                hint = "No number." if not words else ("Higher." if int(words[-1]) < target else "Lower.")
                seg = await it.turn(hint)

__all__ = ["GuessTaskset", "GuessEnv"]
'''

SYNC_REWARD = SINGLE.replace("    async def brief", "    def brief")  # verifiers awaits every reward


@pytest.fixture
def vf_modules(tmp_path, monkeypatch):
    for name, text in [("echo_vf_sum", SINGLE), ("echo_vf_game", GAME), ("echo_vf_sync", SYNC_REWARD)]:
        (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("echo_vf_sum", "echo_vf_game", "echo_vf_sync"):
        sys.modules.pop(name, None)


def vf(name, **options):
    return make_task(SimpleNamespace(name=f"vf:{name}", seed=0, options=options))


def test_names():
    assert parse_task_name("vf:my_env").kind == "vf" and parse_task_name("vf:org/my-env@1.0").target == "org/my-env@1.0"
    with pytest.raises(ValueError, match="verifiers taskset id"):
        parse_task_name("vf:")


def test_a_single_turn_taskset_scores_with_its_weighted_rewards(vf_modules):
    task = vf("echo_vf_sum", count=30, eval_fraction=0.2)
    assert not is_env_task(task) and task.version.startswith("echo_vf_sum@")
    train = {task.problem("train", i).question for i in range(60)}
    ev = {task.problem("eval", i).question for i in range(20)}
    assert len(train) == 24 and len(ev) == 6 and not (train & ev)
    p = task.problem("train", 0)
    assert task.messages(p) == [{"role": "system", "content": "Answer with a number."},
                                {"role": "user", "content": p.question}]
    assert task.reward(p, f"It is {p.answer}") == 1.0
    assert task.reward(p, "I am not sure at all, sorry") == pytest.approx(-0.5)  # any finite value


def test_a_reward_verifiers_cannot_run_stops_the_build(vf_modules):
    with pytest.raises(ValueError, match=r"vf:echo_vf_sync: scoring the first training task .* failed.*awaitable"):
        vf("echo_vf_sync")
    with pytest.raises(ValueError, match="(?s)cannot load the verifiers taskset.*count"):
        vf("echo_vf_sum", count="many")
    with pytest.raises(ValueError, match="not found"):
        vf("echo_vf_missing")


def test_a_multi_turn_env_is_an_environment(vf_modules, chatml_tokenizer):
    task = vf("echo_vf_game", max_turns=4)
    assert is_env_task(task) and task.max_turns == 4
    p = task.problem("train", 0)
    target = int(p.answer)
    env = task.make_env()
    assert env.reset(p) == p.question
    assert env.step("I say 99.") == ("Lower.", False)
    assert env.step("no idea") == ("No number.", False)
    assert env.step(f"{target}") == ("", True)
    assert task.episode_reward(p, ["99", f"{target}"]) == pytest.approx(1.0 - 0.2)
    assert task.episode_reward(p, ["99", "99", "99", "99", f"{target}"]) == pytest.approx(-0.4)  # 4 turns, lost

    replies = iter([" 99", f" {target}"])

    def generate(ids):
        out = chatml_tokenizer(next(replies) + "<|im_end|>")["input_ids"]
        return out, [-0.5] * len(out), "stop"

    ep = run_episode(task, p, chatml_tokenizer, generate)
    assert ep.done and ep.turns == 2 and ep.reward == pytest.approx(0.8)
    ids, mask = flatten_segments([s for s in ep.segments if s.kind != "prompt"])
    replay = replay_record(task, p, chatml_tokenizer, ids, mask)
    assert replay.error is None and replay.done
    forged = list(ids)
    env_at = mask.index(0)
    forged[env_at + 2] = forged[env_at + 2] + 1  # a node that changes the env's words is caught
    assert replay_record(task, p, chatml_tokenizer, forged, mask).error is not None


def test_an_env_that_awaits_anything_else_gives_no_reward(vf_modules, tmp_path, caplog):
    (tmp_path / "echo_vf_sleepy.py").write_text(GAME.replace("seg = await it.turn(hint)",
                                                             "import asyncio; await asyncio.sleep(0.01); seg = await it.turn(hint)"))
    try:
        task = vf("echo_vf_sleepy")
        p = task.problem("train", 0)
        assert math.isnan(task.episode_reward(p, ["99", p.answer])) and "may await only interaction.turn()" in caplog.text
    finally:
        sys.modules.pop("echo_vf_sleepy", None)


def test_segment_type_is_the_interface_one():
    assert Segment("model", [1]).kind == "model"
