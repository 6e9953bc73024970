"""The math task: procedural problems, the GSM8K-form loader, splits, strict rewards."""

from __future__ import annotations

import json

import pytest

from tasks.math_jsonl import MathConfig, MathTask, load_jsonl, parse_gsm8k_answer, parse_record


def _write(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def _gsm(i: int) -> dict:
    return {"question": f"Pat has {i} pens and buys {i + 1} more. How many pens?",
            "answer": f"Pat has {i} + {i + 1} = <<{i}+{i + 1}={2 * i + 1}>>{2 * i + 1} pens.\n#### {2 * i + 1}"}


@pytest.mark.parametrize("answer,value", [
    ("So 5.\n#### 5", 5), ("#### 1,234", 1234), ("####-7", -7), ("work\n#### 72  \n", 72), ("#### 007", 7),
])
def test_gsm8k_answer_accepts(answer, value):
    assert parse_gsm8k_answer(answer) == value


@pytest.mark.parametrize("answer", [
    "", "5", "#### 2.5", "#### 12 apples", "#### 1,23", "#### 5\nmore text", "#### five", "#### " + "9" * 13,
    "#### \u0665",
])
def test_gsm8k_answer_rejects(answer):
    assert parse_gsm8k_answer(answer) is None


def test_loader_keeps_valid_lines_and_reports_the_rest(tmp_path):
    path = _write(tmp_path / "d.jsonl", [
        _gsm(1), "{not json", {"question": "", "answer": "#### 1"}, {"question": "q?"},
        {"question": "q?", "answer": "#### 2.5"}, [1, 2], "", _gsm(2),
        {"question": "x" * 30_000, "answer": "#### 1"},
    ])
    records, rejected = load_jsonl(path)
    assert [r.answer for r in records] == [3, 5]
    assert [n for n, _ in rejected] == [2, 3, 4, 5, 6, 9]
    assert all(why for _, why in rejected)
    with pytest.raises(ValueError, match="question"):
        parse_record(json.dumps({"answer": "#### 3"}))


def test_procedural_default_and_strict_reward():
    t = MathTask()
    p = t.problem("train", 0)
    assert p.id.startswith("math-") and isinstance(p.answer, int)
    assert {t.problem("train", i).question.count("Then ") for i in range(100)} == {1, 2}
    assert t.reward(p, f"Answer: {p.answer}") == 1.0
    for bad in [f"Answer: {p.answer}\nAnswer: {p.answer}", f"answer: {p.answer + 1}\nAnswer: {p.answer}",
                f"<answer>{p.answer}</answer>", "x" * 5000 + f"\nAnswer: {p.answer}", f"Answer: {p.answer + 1}"]:
        assert t.reward(p, bad) == 0.0


def test_user_file_hash_split_is_disjoint_and_cycles(tmp_path):
    path = _write(tmp_path / "train.jsonl", [_gsm(i) for i in range(400)])
    t = MathTask(MathConfig(data_path=str(path)), seed=1)
    n_train, n_eval = len(t._splits["train"]), len(t._splits["eval"])
    assert n_train + n_eval == 400 and n_eval > 0
    train = [t.problem("train", i) for i in range(n_train)]
    assert len({p.question for p in train}) == n_train  # one pass visits every record once
    evals = {t.problem("eval", i).question for i in range(n_eval)}
    assert not evals & {p.question for p in train}
    again = t.problem("train", n_train + 3)  # the second pass is another permutation of the same records
    assert again.question in {p.question for p in train} and again.id != train[3].id
    p = train[0]
    assert t.reward(p, f"The total is {p.answer}.\nAnswer: {p.answer}") == 1.0
    assert MathTask(MathConfig(data_path=str(path)), seed=1).problem("train", 7) == t.problem("train", 7)


def test_separate_eval_file_and_procedural_mix(tmp_path):
    train = _write(tmp_path / "train.jsonl", [_gsm(i) for i in range(20)])
    test = _write(tmp_path / "test.jsonl", [_gsm(i) for i in range(100, 105)])
    t = MathTask(MathConfig(data_path=str(train), eval_data_path=str(test)))
    assert {t.problem("eval", i).answer for i in range(5)} == {2 * i + 1 for i in range(100, 105)}
    big = _write(tmp_path / "big.jsonl", [_gsm(i) for i in range(400)])
    mixed = MathTask(MathConfig(data_path=str(big), procedural_fraction=0.5))
    ids = [mixed.problem("train", i).id for i in range(200)]
    procedural = sum(i.startswith("math-arith-") for i in ids)
    assert 60 < procedural < 140


def test_bad_files_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        MathTask(MathConfig(data_path=str(tmp_path / "missing.jsonl")))
    junk = _write(tmp_path / "junk.jsonl", ["nope", "{}"])
    with pytest.raises(ValueError, match="no valid"):
        MathTask(MathConfig(data_path=str(junk)))
    one = _write(tmp_path / "one.jsonl", [_gsm(1)])
    with pytest.raises(ValueError, match="split is empty"):
        MathTask(MathConfig(data_path=str(one)))
    with pytest.raises(ValueError):
        MathConfig(eval_data_path="x.jsonl")
    with pytest.raises(ValueError):
        MathConfig(procedural_fraction=1.5)
