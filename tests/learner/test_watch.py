"""Sampled completions and the held-out curve: picked, written, cut on resume, sent to TensorBoard."""

from __future__ import annotations

import json
import math

from learner.coordinator import CompletedGroup, GroupSpec
from learner.eval import EvalSample
from learner.heldout import EvalPoint
from learner.metrics import MetricsWriter
from learner.report_to import ReportConfig, build_sinks
from learner.watch import COMPLETIONS_FILE, EVAL_FILE, RunWatch, eval_records, read_watch, sampled_completions
from swarm.proto.rollouts import Completion, GroupResult
from tasks.arith import ArithTask


class _Tokenizer:
    """Token id i decodes to chr(ord('a') + i % 26); id 0 is a special token (skipped)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i % 26) for i in ids if not (skip_special_tokens and i == 0))


def _groups() -> list[CompletedGroup]:
    out = []
    for k, version in ((3, 4), (7, 5)):
        comps = [Completion([0, k, k + j], [-1.0] * 3, "stop" if j else "length") for j in range(3)]
        out.append(CompletedGroup(GroupSpec(f"g{k}", [1, 2], str(k)), GroupResult(f"g{k}", version, comps),
                                  f"peer{k}", 0.0))
    return out


def test_completions_are_taken_in_turn_from_the_groups_with_their_reward_and_advantage():
    task = ArithTask(seed=0)
    rewards = [1.0, 0.0, float("nan"), 0.5, 0.5, 1.0]
    adv = [1.2, -0.6, 0.0, -0.7, -0.7, 1.4]
    recs = sampled_completions(9, _groups(), rewards, adv, task, _Tokenizer(), 4)
    assert [(r.group, r.completion) for r in recs] == [("g3", "dd"), ("g7", "hh"), ("g3", "de"), ("g7", "hi")]
    assert [r.reward for r in recs] == [1.0, 0.5, 0.0, 0.5] and [r.advantage for r in recs] == [1.2, -0.7, -0.6, -0.7]
    problem = task.problem("train", 3)
    assert recs[0].question == problem.question and recs[0].answer == str(problem.answer)
    assert {(r.version, r.peer, r.step, r.split) for r in recs[:2]} == {(4, "peer3", 9, "train"),
                                                                         (5, "peer7", 9, "train")}
    assert recs[0].finish == "length" and recs[2].finish == "stop" and recs[0].tokens == 3
    every = sampled_completions(9, _groups(), rewards, adv, task, _Tokenizer(), 100)
    assert len(every) == 6 and every[4].reward is None  # a failed reward (NaN) is shown as no reward
    assert sampled_completions(9, _groups(), rewards, adv, task, _Tokenizer(), 0) == []


def _point(step: int, acc: float) -> EvalPoint:
    return EvalPoint(step, step, 4, round(4 * acc), acc, max(0.0, acc - 0.3), min(1.0, acc + 0.3), acc, 1.5)


def _samples(n: int) -> list[EvalSample]:
    return [EvalSample(i, f"q{i}", f"a{i}", str(i), float(i % 2), 5) for i in range(n)]


def tensorboard_texts(run_dir) -> dict[str, list[tuple[int, str]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"]}


def test_run_watch_writes_files_sinks_and_its_snapshot(tmp_path):
    from test_report_to import tensorboard_scalars

    metrics = MetricsWriter(tmp_path, sinks=build_sinks(ReportConfig(to=["tensorboard"]), tmp_path))
    watch = RunWatch(tmp_path, metrics, eval_samples=2)
    assert watch.evaluated(_point(0, 0.25), _samples(4))["eval_accuracy"] == 0.25
    recs = sampled_completions(1, _groups(), [1.0, 0, 0, 0, 0, 1.0], [0.5] * 6, ArithTask(seed=0), _Tokenizer(), 3)
    metrics.write({"step": 1, "reward_mean": 0.3})
    watch.completions(1, recs)
    fields = watch.evaluated(_point(2, 0.75), _samples(4))
    metrics.write({"step": 2, "reward_mean": 0.5, **fields})
    metrics.close()

    lines = [json.loads(x) for x in (tmp_path / COMPLETIONS_FILE).read_text().splitlines()]
    assert [(x["step"], x["split"]) for x in lines] == [(0, "eval")] * 2 + [(1, "train")] * 3 + [(2, "eval")] * 2
    assert [json.loads(x)["accuracy"] for x in (tmp_path / EVAL_FILE).read_text().splitlines()] == [0.25, 0.75]
    stats = watch.statistics()
    assert [p.step for p in stats.evals] == [0, 2] and len(stats.completions) == 3
    assert [r.group for r in stats.eval_samples] == ["eval-0", "eval-1"] and stats.eval_samples[0].step == 2
    assert read_watch(tmp_path) == stats  # the report rebuilds the same snapshot from the files
    tb = tensorboard_scalars(tmp_path)
    assert tb["eval_accuracy"] == [(0, 0.25), (2, 0.75)]  # step 0 has no row: sent by the watch itself
    texts = tensorboard_texts(tmp_path)
    assert [s for s, _ in texts["completions/text_summary"]] == [1]
    table = texts["completions/text_summary"][0][1]
    assert table.count("\n") == 4 and "| step | split | version |" in table and recs[0].completion in table
    assert [s for s, _ in texts["eval_completions/text_summary"]] == [0, 2]


def test_resume_cuts_what_came_after_the_checkpoint(tmp_path):
    metrics = MetricsWriter(tmp_path)
    watch = RunWatch(tmp_path, metrics, eval_samples=1)
    for step in (0, 2, 4):
        watch.evaluated(_point(step, step / 10), _samples(2))
    recs = sampled_completions(3, _groups(), [1.0] * 6, [0.0] * 6, ArithTask(seed=0), _Tokenizer(), 2)
    watch.completions(3, recs)
    again = RunWatch(tmp_path, MetricsWriter(tmp_path, resume=True, resume_step=3), resume_step=3, eval_samples=1)
    stats = again.statistics()
    assert [p.step for p in stats.evals] == [0, 2] and [r.step for r in stats.completions] == [3, 3]
    assert [r.step for r in stats.eval_samples] == [2]
    assert [json.loads(x)["step"] for x in (tmp_path / EVAL_FILE).read_text().splitlines()] == [0, 2]
    fresh = RunWatch(tmp_path, MetricsWriter(tmp_path))  # a new run starts empty files
    assert fresh.statistics().evals == () and (tmp_path / COMPLETIONS_FILE).read_text() == ""


def test_eval_records_keep_the_first_answers():
    recs = eval_records(_point(5, 0.5), _samples(3), 2)
    assert [(r.group, r.peer, r.advantage, r.split, r.step) for r in recs] == [
        ("eval-0", "learner", None, "eval", 5), ("eval-1", "learner", None, "eval", 5)]
    assert all(math.isfinite(r.reward) for r in recs) and eval_records(_point(5, 0.5), _samples(3), 0) == []
