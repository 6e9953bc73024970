"""Held-out evaluation while training: when, with how many threads, and a real llama.cpp run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from common.lora import LoraAdapter
from learner.config import LearnerConfig
from learner.heldout import EvalConfig, EvalPoint, build_heldout, eval_due, eval_threads
from learner.models import load_tokenizer, resolve_model
from swarm.config import ConfigError, load_config
from tasks.arith import ArithTask


def test_due_every_n_steps_and_after_the_last():
    assert [s for s in range(0, 13) if eval_due(5, s, 12)] == [5, 10, 12]
    assert [s for s in range(0, 11) if eval_due(5, s, 10)] == [5, 10]
    assert not any(eval_due(0, s, 10) for s in range(11))  # off; step 0 is eval.on_start's
    assert not any(eval_due(10, s, 3) for s in range(4))  # a run shorter than `every` has no curve
    assert EvalConfig(every=10).evaluates(10) and not EvalConfig(every=10).evaluates(9)
    assert not EvalConfig(every=0).evaluates(100)


def test_threads_follow_the_sync_mode_unless_set():
    assert eval_threads(0, "sequential", 2) == 1 and eval_threads(0, "sequential", 16) == 8
    assert eval_threads(0, "async", 16) == 1 and eval_threads(3, "async", 16) == 3


def test_config_section_and_its_checks():
    cfg = load_config(LearnerConfig, None, ["eval.every=3", "eval.n=5", "eval.on_start=false"])
    assert (cfg.eval.every, cfg.eval.n, cfg.eval.on_start) == (3, 5, False)
    for bad, msg in (("eval.n=0", "eval.n must be >= 1"), ("eval.every=-1", "eval.every must be >= 0"),
                     ("eval.temperature=-0.5", "eval.temperature")):
        with pytest.raises(ConfigError, match=msg):
            load_config(LearnerConfig, None, [bad])


def _random_adapter(hf_dir, seed: int) -> LoraAdapter:
    cfg = json.loads((hf_dir / "config.json").read_text())
    hidden, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = hidden // heads
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for module, fan_out in (("q_proj", hidden), ("v_proj", kv * head_dim)):
            stem = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{stem}.lora_A.weight"] = (rng.standard_normal((4, hidden)) / np.sqrt(hidden)).astype(np.float32)
            tensors[f"{stem}.lora_B.weight"] = (rng.standard_normal((fan_out, 4)) * 0.5).astype(np.float32)
    return LoraAdapter(version=3, rank=4, alpha=8.0, target_modules=["q_proj", "v_proj"], tensors=tensors)


def test_a_real_evaluation_scores_the_adapter_it_is_given():
    """llama.cpp on the default GGUF, greedy: the base twice gives the same answers; a random
    adapter changes them; every answer's reward is the task's on its text."""
    cfg = load_config(LearnerConfig, None, ["eval.n=2", "eval.threads=1", "train.max_tokens=10", "train.steps=20"])
    resolved = resolve_model("default")
    task, tokenizer = ArithTask(seed=0), load_tokenizer(resolved.hf_dir)
    heldout = build_heldout(cfg, resolved.gguf_path, resolved.hf_dir, task, tokenizer)
    try:
        base, base_samples = heldout.run(None)
        again, again_samples = heldout.run(None)
        tuned, tuned_samples = heldout.run(_random_adapter(resolved.hf_dir, 1))
    finally:
        heldout.close()
    assert base.n == 2 and [s.completion for s in base_samples] == [s.completion for s in again_samples]
    assert [s.completion for s in tuned_samples] != [s.completion for s in base_samples]
    for s in base_samples + tuned_samples:
        problem = task.problem("eval", s.index)
        assert s.question == problem.question and s.reward == task.reward(problem, s.completion)
        assert 0 < s.tokens <= 10 and s.finish == ("length" if s.tokens == 10 else "stop")
    point = EvalPoint.of(4, 4, tuned)
    assert point.fields()["eval_n"] == 2 and point.fields()["eval_correct"] == tuned.correct
    for off in (["eval.every=0"], ["train.steps=3"]):  # evaluation off; a run too short for a curve
        assert build_heldout(load_config(LearnerConfig, None, off), resolved.gguf_path, resolved.hf_dir, task,
                             tokenizer) is None


def test_stop_ends_an_evaluation_at_its_next_problem():
    """A learner stopped mid-evaluation (trio cancels it; the thread is abandoned) does not wait
    for the rest: the evaluation stops before its next problem, and close() waits for that."""
    import threading

    from learner.heldout import EvalStopped, HeldOutEval

    started, release = threading.Event(), threading.Event()

    class Backend:  # the shape of LlamaCppBackend that the evaluator uses (EvalBackend)
        made = 0

        def set_adapter(self, adapter):
            pass

        def generate_group(self, ids, n, params):
            Backend.made += 1
            started.set()
            release.wait(10)
            from swarm.proto.rollouts import Completion

            return [Completion([5], [-1.0], "stop")]

        def close(self):
            pass

    class Tokenizer:
        def decode(self, ids, skip_special_tokens=True):
            return "7"

    task = ArithTask(seed=0)
    task.render_prompt = lambda tokenizer, problem: [1, 2, 3]
    backend = Backend()
    heldout = HeldOutEval(EvalConfig(n=50), task, Tokenizer(), lambda: backend, max_tokens=8, seed=0, multi_turn=False)
    errors = []
    worker = threading.Thread(target=lambda: errors.append(_raises(heldout.run, None)))
    worker.start()
    assert started.wait(10)
    heldout.stop()
    release.set()
    worker.join(10)
    heldout.close()
    assert errors == [EvalStopped] and Backend.made == 1
    assert _raises(heldout.run, None) is EvalStopped  # stopped for good


def _raises(fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - the test looks at which
        return type(e)
    return None
