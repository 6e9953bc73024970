"""tasks/rewards.py: reward functions in TRL's batch form and verifiers' keyword form, weighted,
guarded, and checked once when the task is built; through the ``data`` task and alone."""

from __future__ import annotations

import json
import math
import sys
from types import SimpleNamespace

import pytest

from tasks.registry import make_task
from tasks.rewards import Example, RewardFn, RewardSet, RewardSignatureError, reward_form

ROWS = [{"question": f"What is {i} + {i}?", "answer": str(2 * i), "solution": f"${2 * i}$", "level": i % 3}
        for i in range(30)]

REWARDS = '''
import asyncio

def trl_len(completions, **kwargs):                       # TRL batch form, standard format
    return [-0.01 * len(c) for c in completions]

def trl_level(completions, level, prompts, completion_ids, **kwargs):   # columns as lists
    assert len(level) == len(completions) == len(prompts) == len(completion_ids)
    return [float(l) if "Answer" in c else None for c, l in zip(completions, level)]

def keyword(completion, answer, state, info):              # verifiers keyword form
    assert state["completion"] == completion and isinstance(info, dict)
    return 1.0 if completion.strip().endswith(answer) else 0.0

async def async_keyword(completion, question):             # a dataset column by name, async
    await asyncio.sleep(0)
    return 2.0 if "+" in question else 0.0

def old_style(completion, answer, prompt):                 # the documented form before: still works
    return 0.5

def positional(text):                                      # neither form
    return 1.0

def returns_scalar(completions, **kwargs):                 # batch form that forgot the list
    return 1.0

def too_short(completions, **kwargs):
    return [1.0]

def raises(completion):
    raise KeyError("oops")
'''


@pytest.fixture
def files(tmp_path, monkeypatch):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "echo_rw_fns.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield path
    sys.modules.pop("echo_rw_fns", None)


def data(path, **options):
    opts = {"path": str(path), "prompt_column": "question", "answer_column": "answer", "instruction": "", **options}
    return make_task(SimpleNamespace(name="data", seed=0, options=opts))


def test_forms_are_read_from_signatures():
    assert reward_form(lambda completions, **kw: [], "a").form == "batch"
    assert reward_form(lambda prompts, completion_ids: [], "a").form == "batch"
    sig = reward_form(lambda completion, answer=None, **kw: 0.0, "a")
    assert sig.form == "keyword" and sig.required == {"completion"} and sig.var_keyword
    with pytest.raises(RewardSignatureError, match="positional-only"):
        reward_form(lambda x, /: 0.0, "a")


def test_weighted_sum_of_both_forms_with_columns(files):
    task = data(files, reward=["echo_rw_fns:keyword", "echo_rw_fns:trl_len", "echo_rw_fns:async_keyword"],
                reward_weights=[1.0, 2.0, 0.5])
    p = task.problem("train", 3)
    right, wrong = f"so {p.answer}", "no idea"
    got = task.score_group(p, [right, wrong], [[1, 2], [3]])
    assert got == pytest.approx([1.0 - 0.02 * len(right) + 1.0, 0.0 - 0.02 * len(wrong) + 1.0])
    assert task.reward(p, right) == pytest.approx(got[0])  # any finite value: no clamp to [0, 1]


def test_none_abstains_and_failures_give_no_reward(files, caplog):
    task = data(files, reward=["echo_rw_fns:trl_level", "echo_rw_fns:old_style"])
    p = task.problem("train", 0)
    level = task.example(p).row["level"]
    assert task.score_group(p, ["Answer: 1", "nothing"], [[], []]) == [level + 0.5, 0.5]
    alone = data(files, reward="echo_rw_fns:trl_level")
    assert math.isnan(alone.score_group(p, ["nothing"])[0]) and "all returned None" in caplog.text


def test_bad_values_are_errors_for_their_completion_only(files, caplog):
    fns = RewardSet([RewardFn("bv", _bad_values, 1.0, reward_form(_bad_values, "bv"))], ["question"])
    ex = Example("q?", "2", {"question": "q?"})
    got = fns.score(ex, ["a", "b", "c", "d"])
    assert math.isnan(got[0]) and math.isnan(got[1]) and got[2] == 1.0 and math.isnan(got[3])
    assert "returned nan" in caplog.text and "not a number" in caplog.text
    with pytest.raises(RewardSignatureError, match=r"'bv' \(batch form\) failed on the first training example.*nan"):
        fns.validate(ex, "Answer: 2")


def _bad_values(completions, **kwargs):
    return [float("nan"), "x", 1.0, None][:len(completions)]


@pytest.mark.parametrize("name,message", [
    ("positional", r"reward 'echo_rw_fns:positional' \(keyword form\) requires parameter\(s\) \['text'\]"),
    ("returns_scalar", r"'echo_rw_fns:returns_scalar' \(batch form\) failed on the first training example: "
                       r"ValueError: returned float, not a list of 1 values"),
    ("too_short", None),  # one completion at validation: a list of one is right
    ("raises", r"'echo_rw_fns:raises' \(keyword form\) failed on the first training example: KeyError"),
])
def test_a_wrong_reward_stops_the_task_build_with_the_forms(files, name, message):
    if message is None:
        task = data(files, reward=f"echo_rw_fns:{name}")
        assert math.isnan(task.score_group(task.problem("train", 0), ["a", "b"])[0])  # wrong length: no reward
        return
    with pytest.raises(ValueError, match=message) as err:
        data(files, reward=f"echo_rw_fns:{name}")
    assert "TRL's batch form" in str(err.value) and "verifiers' keyword form" in str(err.value)


def test_weights_must_match(files):
    with pytest.raises(ValueError, match="one number per reward"):
        data(files, reward=["math", "exact"], reward_weights=[1.0])
    with pytest.raises(ValueError, match="not a finite number"):
        data(files, reward=["math"], reward_weights=[float("inf")])


def test_trl_shipped_rewards_on_a_conversational_dataset(tmp_path):
    """TRL's own ``accuracy_reward`` (reads the ``solution`` column, conversational completions)
    and its soft overlong punishment (reads ``completion_ids``), as GRPOTrainer calls them."""
    rows = [{"prompt": [{"role": "user", "content": f"Compute {i} * 2."}], "solution": f"${2 * i}$",
             "answer": str(2 * i)} for i in range(12)]
    from trl.rewards import accuracy_reward, get_soft_overlong_punishment

    overlong = get_soft_overlong_punishment(max_completion_len=10, soft_punish_cache=5)
    fns = RewardSet([RewardFn("accuracy", accuracy_reward, 1.0, reward_form(accuracy_reward, "accuracy")),
                     RewardFn("overlong", overlong, 1.0, reward_form(overlong, "overlong"))],
                    ["prompt", "solution", "answer"])
    ex = Example(rows[3]["prompt"], "6", rows[3], conversational=True)
    got = fns.score(ex, [r"It is \boxed{6}", r"It is \boxed{7}"], [[1] * 4, [1] * 9])
    assert got == pytest.approx([1.0, -0.8])
    fns.validate(ex, r"\boxed{6}")


def test_a_conversational_data_task_renders_its_messages(tmp_path, monkeypatch):
    rows = [{"prompt": [{"role": "user", "content": f"Compute {i} * 2."}], "solution": f"${2 * i}$",
             "answer": str(2 * i)} for i in range(12)]
    path = tmp_path / "conv.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "echo_rw_conv.py").write_text(
        "from trl.rewards import accuracy_reward\n__all__ = ['accuracy_reward']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    task = make_task(SimpleNamespace(name="data", seed=0, options={
        "path": str(path), "instruction": "", "reward": "echo_rw_conv:accuracy_reward"}))
    p = task.problem("train", 0)
    msgs = task.messages(p)
    assert msgs[0]["role"] == "system" and msgs[-1]["content"].startswith("Compute ") and p.question == msgs[-1]["content"]
    assert task.score_group(p, [rf"\boxed{{{p.answer}}}", "no"]) == [1.0, 0.0]
    sys.modules.pop("echo_rw_conv", None)
