"""task "data": prompts and answers from local JSONL / Parquet / CSV files through `datasets`."""

from __future__ import annotations

import json
import math
import sys
from types import SimpleNamespace

import pytest

from tasks.data_files import DataConfig, split_records
from tasks.registry import make_task

ROWS = [{"q": f"What is {i} + {i}?", "a": 2 * i, "part": "test" if i % 4 == 0 else "train"} for i in range(40)]


def data(path, seed=0, **options):
    return make_task(SimpleNamespace(name="data", seed=seed, options={"path": str(path), **options}))


@pytest.fixture
def files(tmp_path):
    import pandas as pd

    df = pd.DataFrame(ROWS)
    out = {"jsonl": tmp_path / "d.jsonl", "parquet": tmp_path / "d.parquet", "csv": tmp_path / "d.csv"}
    out["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    df.to_parquet(out["parquet"])
    df.to_csv(out["csv"], index=False)
    return out


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv"])
def test_every_format_reads_the_same_problems(files, fmt):
    task = data(files[fmt], prompt_column="q", answer_column="a", split_column="part")
    ev = {task.problem("eval", i).question for i in range(30)}
    assert ev == {r["q"] for r in ROWS if r["part"] == "test"}
    p = task.problem("train", 0)
    assert p.question.startswith("What is") and task.reward(p, f"It is.\nAnswer: {p.answer}") == 1.0


def test_fraction_split_is_fixed_disjoint_and_seeded(files):
    a = data(files["jsonl"], prompt_column="q", answer_column="a", eval_fraction=0.25)
    b = data(files["jsonl"], prompt_column="q", answer_column="a", eval_fraction=0.25)
    c = data(files["jsonl"], prompt_column="q", answer_column="a", eval_fraction=0.25, split_seed=1)
    ev = lambda t: {t.problem("eval", i).question for i in range(40)}  # noqa: E731
    tr = lambda t: {t.problem("train", i).question for i in range(100)}  # noqa: E731
    assert ev(a) == ev(b) and len(ev(a)) == 10 and not (ev(a) & tr(a)) and len(tr(a)) == 30
    assert ev(a) != ev(c)


def test_duplicate_prompts_stay_in_one_split():
    rows = [{"prompt": "same", "answer": "1", "s": "train"}, {"prompt": "same", "answer": "1", "s": "test"},
            {"prompt": "other", "answer": "2", "s": "train"}]
    cfg = DataConfig(path="x.jsonl", split_column="s")
    out = split_records(rows, cfg)
    assert {r.prompt for r in out["eval"]} == {"same"} and {r.prompt for r in out["train"]} == {"other"}


def test_math_and_exact_rewards(files):
    math = data(files["jsonl"], prompt_column="q", answer_column="a")
    p = math.problem("train", 0)
    assert math.reward(p, f"Answer: {p.answer}.0") == 1.0
    assert math.reward(p, f"Answer: 1, {p.answer}") == 0.0
    exact = data(files["jsonl"], prompt_column="q", answer_column="a", reward="exact")
    assert exact.reward(p, f"Answer: {p.answer}") == 1.0 and exact.reward(p, f"Answer: {p.answer}.0") == 0.0
    assert "Answer:" in math.messages(p)[-1]["content"]


def test_a_reward_callable_alone(files, tmp_path, monkeypatch):
    (tmp_path / "my_reward_fn.py").write_text(
        "def score(completion, answer, prompt):\n"
        "    if completion == 'boom':\n        raise ValueError('bad')\n"
        "    return 1.0 if completion.strip().endswith(answer) else 0.25\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        task = data(files["csv"], prompt_column="q", answer_column="a", reward="my_reward_fn:score", instruction="")
        p = task.problem("eval", 2)
        assert task.reward(p, f"so {p.answer}") == 1.0 and task.reward(p, "dunno") == 0.25
        assert math.isnan(task.reward(p, "boom"))  # no reward (logged), not a silent 0
        assert task.messages(p)[-1]["content"] == p.question
    finally:
        sys.modules.pop("my_reward_fn", None)


def test_bad_input_is_a_clear_error(files, tmp_path):
    with pytest.raises(ValueError, match="path: the data file is required"):
        make_task(SimpleNamespace(name="data", seed=0, options={}))
    with pytest.raises(FileNotFoundError, match="data file not found"):
        data(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="use a"):
        data(tmp_path / "x.txt")
    with pytest.raises(ValueError, match=r"no column\(s\) \['prompt', 'answer'\]"):
        data(files["jsonl"])
    with pytest.raises(ValueError, match="eval split is empty"):
        data(files["jsonl"], prompt_column="q", answer_column="a", split_column="part", eval_value="nope")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="cannot read it as parquet"):
        data(bad)
    with pytest.raises(ValueError, match="unknown knob"):
        data(files["jsonl"], colour=1)
