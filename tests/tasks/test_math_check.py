"""math-verify behind the math task's answer check: equivalent forms match, candidate lists do not."""

from __future__ import annotations

import threading

import pytest

from tasks.math_check import answers_match, parse_answer_line, single_expression
from tasks.math_jsonl import MathTask
from tasks.base import Problem


@pytest.mark.parametrize("text,value", [
    ("Answer: 7", "7"), ("work\nAnswer: 7.", "7"), ("Answer:   $\\frac{1}{2}$  ", "$\\frac{1}{2}$"),
    ("Answer: 7\n\n", "7"),
    ("Answer: 7\nAnswer: 7", None), ("answer = 3\nAnswer: 7", None), ("Answer: 7\nmore", None),
    ("Answer:", None), ("", None), ("x" * 5000 + "\nAnswer: 7", None), (None, None),
])
def test_parse_answer_line(text, value):
    assert parse_answer_line(text) == value


@pytest.mark.parametrize("value,ok", [
    ("7", True), ("-7", True), ("7.0", True), ("14/2", True), ("\\frac{14}{2}", True), ("$7$", True),
    ("\\boxed{7}", True), ("1,234", True), ("3, 7", False), ("7 apples", False), ("x = 7", False),
    ("9^9^9", False), ("2**100", False), ("7!", False), ("seven", False), ("", False), ("1" * 65, False),
])
def test_single_expression(value, ok):
    assert single_expression(value) is ok


@pytest.mark.parametrize("reference,value,match", [
    ("7", "7", True), ("7", "7.0", True), ("7", "14/2", True), ("7", "\\frac{14}{2}", True), ("7", "$7$", True),
    ("7", "\\boxed{7}", True), ("1234", "1,234", True), ("0.5", "1/2", True), ("7", "8", False),
    ("7", "-7", False), ("7", "6.99", False), ("7", "3, 7", False), ("7", "7 apples", False),
    ("Paris", "paris", True), ("Paris", "Lyon", False),
])
def test_answers_match(reference, value, match):
    assert answers_match(reference, value) is match


def test_runs_off_the_main_thread():
    out = []
    t = threading.Thread(target=lambda: out.append(answers_match("12", "\\frac{24}{2}")))
    t.start()
    t.join(30)
    assert out == [True]


def test_math_task_reward_uses_math_verify():
    task = MathTask()
    p = Problem("p", "q", 12)
    assert task.reward(p, "12 = 24/2\nAnswer: 24/2") == 1.0
    assert task.reward(p, "Answer: 12.0") == 1.0
    assert task.reward(p, "Answer: 11") == 0.0
    assert task.reward(p, "Answer: 11, 12") == 0.0
    assert task.reward(p, "12") == 0.0
