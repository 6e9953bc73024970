"""Knights and Knaves: unique solutions, the generator's knobs, the strict parser, rewards."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings, strategies as st

from tasks.base import MAX_COMPLETION_CHARS, Problem
from tasks.knights import (
    FEWSHOT_EXAMPLES,
    FEWSHOT_PUZZLES,
    KnightsConfig,
    KnightsTask,
    evaluate,
    format_answer,
    parse_assignment,
    puzzle_text,
    solutions,
)


def _brute_force(statements):
    """An independent check: count consistent assignments with plain loops."""
    n, count = len(statements), []
    for bits in range(2 ** n):
        a = tuple(bool(bits >> (n - 1 - i) & 1) for i in range(n))
        if all(a[i] == evaluate(s, a) for i, s in enumerate(statements)):
            count.append(a)
    return count


def _ops(f):
    yield f[0]
    if f[0] != "is":
        for sub in f[1:]:
            yield from _ops(sub)


def test_evaluate_connectives():
    a = (True, False)
    k0, k1 = ("is", 0, True), ("is", 1, True)
    assert evaluate(k0, a) and not evaluate(k1, a) and evaluate(("is", 1, False), a)
    assert evaluate(("not", k1), a) and not evaluate(("and", k0, k1), a) and evaluate(("or", k0, k1), a)
    assert not evaluate(("iff", k0, k1), a) and not evaluate(("implies", k0, k1), a)
    assert evaluate(("implies", k1, k0), a) and evaluate(("iff", ("not", k0), k1), a)


def test_atoms_alone_never_give_a_unique_solution():
    # why max_depth >= 1: flipping everyone keeps bare-atom statements consistent
    for statements in itertools.product([("is", 1, True), ("is", 1, False)], [("is", 0, True), ("is", 0, False)]):
        assert len(solutions(list(statements))) != 1


def test_solutions_of_a_classic():
    # A: "B is a knave." B: "A and I are both knights." -> A knight, B knave.
    statements = [("is", 1, False), ("and", ("is", 0, True), ("is", 1, True))]
    assert solutions(statements) == [(True, False)] == _brute_force(statements)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**9), people=st.integers(2, 8), depth=st.integers(1, 2))
def test_generated_puzzles_have_exactly_one_solution(seed, people, depth):
    t = KnightsTask(KnightsConfig(min_people=people, max_people=people, max_depth=depth), seed=seed)
    p = t.problem(random.Random(seed).choice(["train", "eval"]), seed % 50)
    names, statements = list(p.data[0]), list(p.data[1])
    assert len(names) == people == len(set(names))
    assert _brute_force(statements) == [tuple(p.answer)]
    assert p.question == puzzle_text(names, statements)
    assert t.reward(p, format_answer(names, p.answer)) == 1.0


def test_operators_and_depth_knobs():
    t = KnightsTask(KnightsConfig(min_people=3, max_people=5, max_depth=2, operators=("iff", "implies")))
    texts = [t.problem("train", i).question for i in range(40)]
    joined = " ".join(texts)
    assert "if and only if" in joined and " then " in joined
    ops = {op for i in range(40) for f in t.problem("train", i).data[1] for op in _ops(f)}
    assert ops == {"is", "iff", "implies"}
    assert {len(t.problem("train", i).data[0]) for i in range(40)} == {3, 4, 5}
    for bad in [dict(min_people=1), dict(max_people=9), dict(operators=("xor",)), dict(operators=()),
                dict(fewshot=5), dict(max_depth=0)]:
        with pytest.raises(ValueError):
            KnightsConfig(**bad)


def test_deterministic_and_splits_disjoint():
    t = KnightsTask(seed=4)
    assert t.problem("eval", 5) == KnightsTask(seed=4).problem("eval", 5)
    train = {t.problem("train", i).question for i in range(400)}
    evals = {t.problem("eval", i).question for i in range(100)}
    assert not train & evals and all(t.split_of(q) == "eval" for q in evals)
    fewshot = {q for q, _ in FEWSHOT_EXAMPLES}
    assert not fewshot & (train | evals)


def test_fewshot_examples_are_unique_and_answered_correctly():
    for names, statements, reply in FEWSHOT_PUZZLES:
        sols = solutions(list(statements))
        assert len(sols) == 1
        assert parse_assignment(reply, list(names)) == sols[0]


# -- the strict parser and the reward ------------------------------------------------------------

NAMES = ["Alice", "Bob", "Carol"]
TRUTH = (True, False, True)
P = Problem(id="k", question="q", answer=TRUTH, data=(tuple(NAMES), ()))


@pytest.mark.parametrize("text", [
    "Answer: Alice is a knight, Bob is a knave, Carol is a knight",
    "Bob lies.\nAnswer: Alice is a knight, Bob is a knave, Carol is a knight.",
    "Answer: Bob is a knave; Carol is a knight; Alice is a knight",
    "Answer: Alice is a knight, Bob is a knave, and Carol is a knight",
    "Answer: alice is a KNIGHT and bob is a knave and carol is a knight",
])
def test_parser_accepts_well_formed(text):
    assert parse_assignment(text, NAMES) == TRUTH


@pytest.mark.parametrize("text", [
    "",
    "Alice is a knight, Bob is a knave, Carol is a knight",  # no marker
    "Answer: Alice is a knight, Bob is a knave",  # someone missing
    "Answer: Alice is a knight, Bob is a knave, Carol is a knight, Bob is a knight",  # repeated name
    "Answer: Alice is a knight, Bob is a knave, Carol is a knight, Dave is a knave",  # unknown name
    "Answer: Alice is a knight, Bob is a knave, Carol is a knight\nAnswer: Alice is a knave, Bob is a knave, Carol is a knight",
    "answer: Alice is a knave, so\nAnswer: Alice is a knight, Bob is a knave, Carol is a knight",  # hidden in reasoning
    "Answer: Alice is a knight, Bob is a knave, Carol is a knight\nHope that helps",  # text after
    "Answer: Alice is a knight or a knave, Bob is a knave, Carol is a knight",  # hedging
    "Answer: Alice is a knight, Bob is not a knight, Carol is a knight",
    "Answer: <answer>Alice is a knight, Bob is a knave, Carol is a knight</answer>",  # injected tags
    "**Answer:** Alice is a knight, Bob is a knave, Carol is a knight",
    "Answer: Alice is a knight, Bob is a knave, Carol is a knight, Alice is a knave",
    "Answer: Alice is a knight,, Bob is a knave, Carol is a knight",
])
def test_parser_rejects_malformed(text):
    assert parse_assignment(text, NAMES) is None


def test_huge_and_non_string_outputs_score_zero():
    good = format_answer(NAMES, TRUTH)
    assert parse_assignment("x" * MAX_COMPLETION_CHARS + "\n" + good, NAMES) is None
    assert parse_assignment(None, NAMES) is None  # type: ignore[arg-type]
    assert KnightsTask().reward(P, "y" * 100 + "\n" + good) == 1.0


def test_reward_full_assignment_and_format_component():
    t = KnightsTask(KnightsConfig(format_reward=0.1))
    assert t.reward(P, format_answer(NAMES, TRUTH)) == 1.0
    wrong = [a for a in itertools.product((True, False), repeat=3) if a != TRUTH]
    assert all(t.reward(P, format_answer(NAMES, a)) == pytest.approx(0.1) for a in wrong)
    assert t.reward(P, "I don't know") == 0.0
    # listing every possible answer is malformed, not a way to collect the reward
    every = "\n".join(format_answer(NAMES, a) for a in itertools.product((True, False), repeat=3))
    assert t.reward(P, every) == 0.0
    assert KnightsTask(KnightsConfig(format_reward=0.0)).reward(P, format_answer(NAMES, wrong[0])) == 0.0


def test_messages_pose_the_puzzle():
    t = KnightsTask()
    p = t.problem("train", 1)
    msgs = t.messages(p)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert p.question in msgs[-1]["content"] and "Answer:" in msgs[-1]["content"]
