"""ArithTask: determinism, disjoint splits, the strict parser, rewards."""

from __future__ import annotations

import pytest

from tasks.arith import ArithConfig, ArithTask
from tasks.base import MAX_COMPLETION_CHARS, Problem, parse_final_answer

N_SPLIT_CHECK = 2000


def test_deterministic_for_same_coordinates():
    a, b = ArithTask(seed=3), ArithTask(seed=3)
    for split in ("train", "eval"):
        for i in range(50):
            assert a.problem(split, i) == b.problem(split, i)


def test_seed_changes_problems():
    a, b = ArithTask(seed=0), ArithTask(seed=1)
    same = sum(a.problem("train", i).question == b.problem("train", i).question for i in range(100))
    assert same < 5


def test_answers_are_consistent_with_default_knobs():
    t = ArithTask()
    for i in range(300):
        p = t.problem("train", i)
        assert isinstance(p.answer, int) and p.answer >= 1
        assert p.question.endswith("have now?")


def test_splits_disjoint_by_construction():
    t = ArithTask(seed=0)
    train = {t.problem("train", i).question for i in range(N_SPLIT_CHECK)}
    evals = {t.problem("eval", i).question for i in range(N_SPLIT_CHECK)}
    assert not (train & evals)
    # duplicates within a split are possible (a finite space), but rare
    assert len(train) > 0.8 * N_SPLIT_CHECK and len(evals) > 0.8 * N_SPLIT_CHECK
    assert all(t.split_of(q) == "eval" for q in evals)


def test_ids_unique_and_split_tagged():
    t = ArithTask()
    ids = {t.problem(s, i).id for s in ("train", "eval") for i in range(100)}
    assert len(ids) == 200


def test_knobs_mul_div_negative():
    t = ArithTask(ArithConfig(operations=("mul", "div", "sub"), min_steps=3, max_steps=3, allow_negative=True), seed=5)
    for i in range(200):
        p = t.problem("train", i)
        assert p.question.count("Then ") == 3
    two = ArithTask(ArithConfig(max_steps=2, max_value=20))
    assert {two.problem("train", i).question.count("Then ") for i in range(100)} == {1, 2}
    with pytest.raises(ValueError):
        ArithConfig(operations=("pow",))
    with pytest.raises(ValueError):
        t.problem("test", 0)  # type: ignore[arg-type]


def test_messages_ask_for_strict_format():
    t = ArithTask()
    p = t.problem("train", 0)
    msgs = t.messages(p)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert p.question in msgs[-1]["content"] and "Answer:" in msgs[-1]["content"]
    for user, reply in zip(msgs[1:-1:2], msgs[2:-1:2]):  # worked examples are well-formed
        assert "Answer:" in user["content"]
        assert parse_final_answer(reply["content"]) is not None
    bare = ArithTask(ArithConfig(fewshot=0)).messages(p)
    assert [m["role"] for m in bare] == ["system", "user"] and bare[1] == msgs[-1]
    with pytest.raises(ValueError):
        ArithConfig(fewshot=99)


def test_fewshot_examples_never_collide_with_problems():
    from tasks.arith import FEWSHOT_EXAMPLES
    t = ArithTask()
    demos = {q for q, _ in FEWSHOT_EXAMPLES}
    assert not demos & {t.problem(s, i).question for s in ("train", "eval") for i in range(500)}


class _FakeTokenizer:
    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    def __call__(self, text, add_special_tokens):
        assert add_special_tokens is False
        return {"input_ids": [ord(c) for c in text]}


def test_render_prompt_uses_chat_template():
    t = ArithTask()
    p = t.problem("eval", 1)
    ids = t.render_prompt(_FakeTokenizer(), p)
    text = "".join(map(chr, ids))
    assert text.startswith("<system>") and text.endswith("<assistant>") and p.question in text


# -- the strict parser ---------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("Answer: 12", 12),
    ("5 + 7 = 12.\nAnswer: 12", 12),
    ("He has 5 left.\n\nAnswer: 5\n", 5),
    ("  Answer:   -3  ", -3),
    ("Answer: 42.", 42),
    ("Answer:7", 7),
    ("Answer: 007", 7),
])
def test_parser_accepts_well_formed(text, expected):
    assert parse_final_answer(text) == expected


@pytest.mark.parametrize("text", [
    "",  # missing
    "The answer is 12.",  # no marker
    "Answer: 12\nAnswer: 13",  # several conflicting answers
    "Answer: 12\nAnswer: 12",  # several (even equal) answers
    "answer: 3, so 3 + 4 = 7\nAnswer: 7",  # an answer hidden in the reasoning
    "Answer = 5. Let me check.\nAnswer: 5",  # another marker form earlier
    "Answer: 12\nI hope this helps!",  # text after the answer line
    "Answer: twelve",  # not an integer
    "Answer: 12 apples",  # trailing garbage
    "Answer: 1.5",  # not an integer
    "Answer: 12 or 13",  # hedging
    "Answer: 1,000",  # thousands separator
    "**Answer:** 12",  # markup
    "<answer>12</answer>",  # injected tags
    "Answer: <answer>12</answer>",  # injected tags on the line
    "Answer: 1234567890123",  # more than MAX_ANSWER_DIGITS digits
    "Answer: \u0661\u0662",  # Arabic-Indic digits
    "Answer: \uff11\uff12",  # fullwidth digits
    "Answer: \U0001d7ce",  # mathematical bold zero
    "Answer: --5",
    "ANSWER: 12",  # case matters on the final line
])
def test_parser_rejects_malformed(text):
    assert parse_final_answer(text) is None


def test_parser_rejects_huge_outputs():
    huge = "x" * MAX_COMPLETION_CHARS + "\nAnswer: 5"
    assert parse_final_answer(huge) is None
    assert parse_final_answer("y" * 100 + "\nAnswer: 5") == 5
    assert parse_final_answer(None) is None  # type: ignore[arg-type]


def test_reward_values_and_range():
    t = ArithTask()
    p = Problem(id="x", question="q", answer=9)
    cases = {"Answer: 9": 1.0, "4 + 5 = 9\nAnswer: 9": 1.0, "Answer: 8": 0.0, "9": 0.0,
             "Answer: 9\nAnswer: 8": 0.0, "Answer: 8\nAnswer: 9": 0.0, "": 0.0}
    for text, want in cases.items():
        r = t.reward(p, text)
        assert r == want and 0.0 <= r <= 1.0
    shaped = ArithTask(ArithConfig(format_reward=0.1))
    assert shaped.reward(p, "Answer: 8") == pytest.approx(0.1)
    assert shaped.reward(p, "Answer: 9") == 1.0 and shaped.reward(p, "nine") == 0.0


def test_reward_on_real_problems_in_unit_interval():
    t = ArithTask()
    for i in range(50):
        p = t.problem("train", i)
        for text in (f"Answer: {p.answer}", f"Answer: {p.answer + 1}", "junk", f"Answer: {p.answer}\n" * 2):
            assert 0.0 <= t.reward(p, text) <= 1.0
        assert t.reward(p, f"So {p.answer}.\nAnswer: {p.answer}") == 1.0


def test_prompt_knobs_do_not_change_problems():
    a, b = ArithTask(), ArithTask(ArithConfig(fewshot=0, format_reward=0.2))
    assert all(a.problem("train", i) == b.problem("train", i) for i in range(20))
    c = ArithTask(ArithConfig(max_value=12))
    assert any(a.problem("train", i).question != c.problem("train", i).question for i in range(20))
