"""The task benches' pure parts: math-verify agreement and the rg: end-to-end check."""

from __future__ import annotations

from types import SimpleNamespace

from bench.math_agreement import compare, forms, old_reward, shape
from bench.rg_tasks import end_to_end
from tasks.math_jsonl import MathTask
from tasks.registry import make_task


def test_forms_and_agreement():
    task = MathTask()
    p = task.problem("train", 0)
    verdicts = {name: (old_reward(q.answer, text), task.reward(q, text)) for name, q, text in forms(p)}
    assert verdicts["integer"] == (1.0, 1.0) and verdicts["wrong"] == (0.0, 0.0)
    assert verdicts["fraction"] == (0.0, 1.0) and verdicts["list"] == (0.0, 0.0) and verdicts["units"] == (0.0, 0.0)
    agree, diffs = compare(task, [(q, text) for _, q, text in forms(p)])
    assert agree + len(diffs) == 11 and all(o == 0.0 and n == 1.0 for _, o, n in diffs)
    assert shape("x\nAnswer: 12/2") == "Answer: 9/9"


class Tok:
    chat_template = ""

    def apply_chat_template(self, msgs, tokenize, add_generation_prompt):
        return " ".join(m["content"] for m in msgs)

    def __call__(self, text, add_special_tokens):
        return {"input_ids": list(range(len(text.split())))}


def test_end_to_end_check_passes_for_rg_and_ours_and_names_failures():
    assert end_to_end(make_task(SimpleNamespace(name="rg:chain_sum", seed=0, options={})), Tok()) == ""
    assert end_to_end(make_task(SimpleNamespace(name="knights", seed=0, options={})), Tok()) == ""
    task = make_task(SimpleNamespace(name="rg:chain_sum", seed=0, options={}))
    task._ds.score_answer = lambda answer, entry: 0.5
    assert "does not score 1" in end_to_end(task, Tok())
