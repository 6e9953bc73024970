"""rg:<dataset>: reasoning-gym generators behind the task interface."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tasks.registry import make_task


def rg(dataset, seed=0, **options):
    return make_task(SimpleNamespace(name=f"rg:{dataset}", seed=seed, options=options))


@pytest.mark.parametrize("dataset", ["basic_arithmetic", "knights_knaves", "sokoban", "chain_sum"])
def test_reference_answer_scores_one_and_garbage_zero(dataset):
    task = rg(dataset)
    for split in ("train", "eval"):
        p = task.problem(split, 3)
        assert task.reward(p, f"Let me think.\n<answer>{p.answer}</answer>") == 1.0
        assert task.reward(p, "no tags at all") == 0.0
        assert task.reward(p, "<answer></answer>") == 0.0


def test_problems_are_deterministic_and_seeded():
    a, b, c = rg("basic_arithmetic", seed=1), rg("basic_arithmetic", seed=1), rg("basic_arithmetic", seed=2)
    assert [a.problem("train", i) for i in range(5)] == [b.problem("train", i) for i in range(5)]
    assert [a.problem("train", i).question for i in range(5)] != [c.problem("train", i).question for i in range(5)]


def test_train_and_eval_never_share_a_question():
    # a tiny problem space (one-digit sums of two terms) repeats questions: the split still holds
    opts = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1, operators=["+"],
                allow_parentheses=False, allow_negation=False)
    train = {rg("basic_arithmetic", seed=s, **opts).problem("train", i).question for s in (0, 1) for i in range(150)}
    ev = {rg("basic_arithmetic", seed=s, **opts).problem("eval", i).question for s in (0, 1) for i in range(40)}
    assert train and ev and not (train & ev)
    task = rg("basic_arithmetic", **opts)
    assert all(task.split_of(q) == "eval" for q in ev)


def test_prompt_has_system_fewshot_and_question():
    task = rg("chain_sum", fewshot=2)
    p = task.problem("eval", 0)
    msgs = task.messages(p)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert "<answer>" in msgs[0]["content"] and msgs[-1]["content"] == p.question
    assert msgs[2]["content"].startswith("<answer>") and msgs[2]["content"].endswith("</answer>")
    examples = {msgs[1]["content"], msgs[3]["content"]}
    assert all(task.split_of(q) == "train" for q in examples)
    assert len(rg("chain_sum", fewshot=0).messages(p)) == 2


def test_prompt_renders_through_a_chat_template():
    class Tok:
        chat_template = "x"

        def apply_chat_template(self, msgs, tokenize, add_generation_prompt):
            assert add_generation_prompt and not tokenize
            return "|".join(m["content"] for m in msgs) + "|gen"

        def __call__(self, text, add_special_tokens):
            return {"input_ids": [len(w) for w in text.split("|")]}

    task = rg("chain_sum", fewshot=0)
    ids = task.render_prompt(Tok(), task.problem("train", 0))
    assert ids[-1] == 3 and len(ids) == 3


def test_options_reach_reasoning_gym_and_bad_ones_are_named():
    task = rg("basic_arithmetic", min_terms=2, max_terms=2, max_digits=1, operators=["+"])
    assert "+" in task.problem("train", 0).question and "*" not in task.problem("train", 0).question
    with pytest.raises(ValueError, match="unknown knob.*'colour'.*max_terms"):
        rg("basic_arithmetic", colour=1)
    with pytest.raises(ValueError, match="unknown knob.*'seed'"):
        make_task(SimpleNamespace(name="rg:basic_arithmetic", seed=0, options={"seed": 3}))
    with pytest.raises(ValueError, match="no dataset 'no_such_dataset'"):
        rg("no_such_dataset")
    with pytest.raises(ValueError, match="task.options for rg:basic_arithmetic"):
        rg("basic_arithmetic", min_terms=5, max_terms=2)


def test_a_scorer_that_raises_scores_zero(caplog):
    task = rg("chain_sum")
    p = task.problem("train", 0)

    def boom(answer, entry):
        raise KeyError("x")

    task._ds.score_answer = boom
    assert task.reward(p, "<answer>1</answer>") == 0.0 and "raised" in caplog.text
