"""The TRL arm of ``swarm-bench colocated --baseline trl`` (a real GRPOTrainer step on a tiny
random-weight Llama) and the time-to-accuracy comparison and goal logic (pure functions)."""

from __future__ import annotations

import json

import pytest

from bench.time_to_accuracy import (accuracy_verdict, arm_figures, goal_line, markdown_table, speed_verdict,
                                    trl_cap_s)
from bench.trl_baseline import EQUAL_ADAPTER, FINAL_ADAPTER, grpo_settings, make_reward, prompt_rows
from learner.config import LearnerConfig
from swarm.config import load_config


def tiny_config(*extra: str):
    return load_config(LearnerConfig, None, ["train.prompts_per_step=2", "train.group_size=2", "train.max_tokens=6",
                                             "train.minibatches=2", *extra])


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from bench.make_model import make_model

    return make_model("llama3", tmp_path_factory.mktemp("tiny") / "llama3", "tiny")


def test_settings_mirror_the_learner_step_and_are_accepted_by_trl(tmp_path):
    from trl import GRPOConfig

    cfg = load_config(LearnerConfig, None, [])
    s = grpo_settings(cfg, tmp_path, max_steps=20)
    t = cfg.train
    assert s["num_generations"] == t.group_size and s["max_completion_length"] == t.max_tokens
    assert s["per_device_train_batch_size"] * s["steps_per_generation"] == t.prompts_per_step * t.group_size
    assert s["steps_per_generation"] == t.minibatches and s["max_steps"] == 20 * t.minibatches
    assert (s["learning_rate"], s["temperature"], s["epsilon"], s["epsilon_high"]) == (t.lr, t.temperature,
                                                                                       t.clip_low, t.clip_high)
    assert s["beta"] == 0.0 and not s["use_vllm"] and not s["gradient_checkpointing"] and not s["shuffle_dataset"]
    args = GRPOConfig(**s)
    assert args.generation_batch_size == t.prompts_per_step * t.group_size
    with pytest.raises(ValueError, match="minibatches"):
        grpo_settings(load_config(LearnerConfig, None, ["train.minibatches=3"]), tmp_path, max_steps=1)


def test_prompts_are_the_learner_prompts_and_the_reward_is_the_task_scorer(tiny_llama):
    from transformers import AutoTokenizer

    from tasks.base import template_kwargs
    from tasks.registry import make_task

    cfg = tiny_config()
    task, tok = make_task(cfg.task), AutoTokenizer.from_pretrained(str(tiny_llama))
    rows = prompt_rows(task, 3)
    assert [r["problem_index"] for r in rows] == [0, 1, 2]
    for r in rows:  # TRL renders conversational prompts with the chat template, as the learner does
        ids = tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True,
                                      **template_kwargs(tok))["input_ids"]
        assert list(ids) == task.render_prompt(tok, task.problem("train", r["problem_index"]))
    sink: list[float] = []
    reward = make_reward(task, tok, sink)
    answers = [task.problem("train", i).answer for i in range(2)]
    completions = [tok.encode(f"Answer: {answers[0]}", add_special_tokens=False),
                   tok.encode(f"Answer: {answers[1] + 1}", add_special_tokens=False), tok.encode("no idea")]
    got = reward(prompts=[None] * 3, completions=[None] * 3, completion_ids=completions, problem_index=[0, 1, 1])
    assert got == [1.0, task.config.format_reward, 0.0] and sink == got


def test_trl_arm_one_step_writes_metrics_and_loadable_adapters(tiny_llama, tmp_path):
    from bench.trl_baseline import run_trl
    from learner.eval import load_peft_adapter
    from learner.metrics import read_metrics

    cfg = tiny_config()
    summary = run_trl(cfg, tiny_llama, tmp_path, max_steps=1, threads=1, equal_wall_s=1e9, max_wall_s=600.0,
                      console=lambda _: None)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1] and rows[0]["samples"] == 4 and rows[0]["optimizer_steps"] == 2
    assert 0.0 <= rows[0]["reward_mean"] <= 1.0 and rows[0]["wall_s"] > 0
    assert summary["steps"] == 1 and summary["samples"] == 4 and not summary["capped"]
    for d in (FINAL_ADAPTER, EQUAL_ADAPTER):
        adapter = load_peft_adapter(tmp_path / d)
        assert adapter.rank == cfg.lora.rank and adapter.alpha == cfg.lora.alpha
        assert set(adapter.target_modules) == set(cfg.lora.target_modules)
    # the step finished within the equal wall-clock, so the equal-time adapter is the trained one
    assert json.loads((tmp_path / EQUAL_ADAPTER / "wall_s.json").read_text())["wall_s"] == pytest.approx(
        rows[0]["wall_s"], abs=0.5)


def rows_of(rewards: list[float], step_s: float = 10.0, samples: int = 64) -> list[dict]:
    return [{"step": i + 1, "reward_mean": r, "samples": samples, "wall_s": step_s * (i + 1)} for i, r in enumerate(rewards)]


def test_cap_is_a_multiple_of_the_swarm_time_to_target_and_covers_its_run():
    assert trl_cap_s(100.0, 200.0, 3.0) == 300.0
    assert trl_cap_s(50.0, 200.0, 3.0) == 200.0  # never below the swarm's whole run (equal-time adapter)
    assert trl_cap_s(None, 200.0, 3.0) == 600.0
    assert trl_cap_s(100.0, 200.0, 3.0, fixed_s=90.0) == 90.0
    assert trl_cap_s(100.0, 200.0, 3.0, limit_s=250.0) == 250.0  # a slot end shortens it
    assert trl_cap_s(100.0, 200.0, 3.0, limit_s=-5.0) == 1.0


def test_seconds_until_a_local_time():
    import time

    from bench.time_to_accuracy import seconds_until

    now = time.mktime((2026, 5, 4, 10, 0, 0, 0, 0, -1))
    assert seconds_until("", now) is None
    assert seconds_until("10:30", now) == pytest.approx(1800.0)
    assert seconds_until("09:30", now) == pytest.approx(86400.0 - 1800.0)  # tomorrow
    with pytest.raises(ValueError, match="HH:MM"):
        seconds_until("ten", now)


def test_speed_verdict_exact_bound_undecided_and_not_reached():
    swarm = arm_figures(rows_of([0.9] * 6, step_s=10.0), 0.8)  # reaches 0.8 at step 1, 10 s
    assert swarm["hit"]["wall_s"] == 10.0 and swarm["hit"]["samples"] == 64
    fast = speed_verdict(swarm, arm_figures(rows_of([0.9] * 3, step_s=40.0), 0.8), 0.8)
    assert fast["ratio"] == pytest.approx(0.25) and not fast["bound"] and fast["met"] is True
    slow = speed_verdict(swarm, arm_figures(rows_of([0.9] * 3, step_s=20.0), 0.8), 0.8)
    assert slow["ratio"] == pytest.approx(0.5) and slow["met"] is False
    never = arm_figures(rows_of([0.1] * 4, step_s=25.0), 0.8)  # 100 s without reaching it
    bound = speed_verdict(swarm, never, 0.8)
    assert bound["bound"] and bound["ratio"] == pytest.approx(0.1) and bound["met"] is True
    assert "did not reach 0.8 in 100 s" in bound["text"] and "at most 0.10" in bound["text"]
    short = speed_verdict(swarm, arm_figures(rows_of([0.1], step_s=20.0), 0.8), 0.8)
    assert short["bound"] and short["met"] is None  # stopped too early to decide
    lost = speed_verdict(arm_figures(rows_of([0.2] * 5), 0.8), never, 0.8)
    assert lost["met"] is False and lost["ratio"] is None


def test_accuracy_verdict_goal_line_and_table():
    e = lambda acc, lo, hi: {"accuracy": acc, "ci_low": lo, "ci_high": hi, "n": 200}  # noqa: E731
    assert accuracy_verdict(e(0.5, 0.43, 0.57), e(0.5, 0.43, 0.57))["met"] is True
    lower = accuracy_verdict(e(0.40, 0.33, 0.47), e(0.60, 0.53, 0.67))
    assert lower["met"] is False and "do not overlap" in lower["text"]
    assert accuracy_verdict(None, e(0.5, 0.4, 0.6))["met"] is None
    speed_ok, speed_undecided = {"met": True, "text": "s"}, {"met": None, "text": "s"}
    assert ": MET." in goal_line(speed_ok, {"met": True, "text": "a"})
    assert "NOT MET" in goal_line(speed_undecided, {"met": False, "text": "a"})
    assert "UNDECIDED" in goal_line(speed_undecided, {"met": True, "text": "a"})
    swarm, trl = arm_figures(rows_of([0.9] * 3), 0.8), arm_figures(rows_of([0.1] * 2), 0.8)
    table = markdown_table(swarm, trl, {"swarm": e(0.6, 0.53, 0.67), "trl-equal": e(0.3, 0.24, 0.37)}, 0.8, 12.0)
    lines = table.splitlines()
    assert lines[0].count("|") == lines[2].count("|") == lines[3].count("|") == 8
    assert "| swarm | 3 | 192 | 30 | 10 | 64 | 0.600 [0.530, 0.670] (n=200) |" == lines[2]
    assert "not reached (best 0.100)" in lines[3] and "(adapter at 12 s)" in lines[3]
