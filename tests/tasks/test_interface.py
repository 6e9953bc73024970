"""The multi-turn contract: chat rendering, env segments, the loss mask, the episode driver."""

from __future__ import annotations

import re

import pytest

from tasks.arith import ArithTask
from tasks.base import Problem
from tasks.interface import (
    EnvTask,
    Segment,
    SingleTurnTask,
    chat_prompt,
    env_turn_ids,
    flatten_segments,
    is_env_task,
    run_episode,
)
from tasks.knights import KnightsTask
from tasks.math_jsonl import MathTask
from tasks.sokoban import SokobanConfig, SokobanTask

CORRIDOR = ("#######", "#@_$_.#", "#######")
SPECIALS = ("<|im_start|>", "<|im_end|>")


class ChatMLTokenizer:
    """A character-level tokenizer with a ChatML template; the two markers are single tokens."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=False):
        ids = []
        for piece in re.split(r"(<\|im_start\|>|<\|im_end\|>)", text):
            if piece in SPECIALS:
                ids.append(1_000_000 + SPECIALS.index(piece))
            else:
                ids += [ord(c) for c in piece]
        return {"input_ids": ids}

    def decode(self, ids, skip_special_tokens=False):
        out = []
        for i in ids:
            if i >= 1_000_000:
                if not skip_special_tokens:
                    out.append(SPECIALS[i - 1_000_000])
            else:
                out.append(chr(i))
        return "".join(out)


TOK = ChatMLTokenizer()
IM_END = TOK("<|im_end|>")["input_ids"]


def test_all_tasks_satisfy_the_single_turn_protocol_and_only_sokoban_the_env_one():
    for task in (ArithTask(), MathTask(), KnightsTask(), SokobanTask()):
        assert isinstance(task, SingleTurnTask)
    assert is_env_task(SokobanTask()) and isinstance(SokobanTask(), EnvTask)
    assert not any(is_env_task(t) for t in (ArithTask(), MathTask(), KnightsTask()))


def test_chat_prompt_matches_the_template():
    turns = [("system", "rules"), ("user", "board")]
    ids = chat_prompt(TOK, turns)
    assert TOK.decode(ids) == "<|im_start|>system\nrules<|im_end|>\n<|im_start|>user\nboard<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ValueError):
        chat_prompt(TOK, [("robot", "x")])


def test_env_turn_ids_close_the_turn_only_when_the_model_did_not():
    after_stop = TOK.decode(env_turn_ids(TOK, "obs", "<|im_end|>"))
    assert after_stop == "\n<|im_start|>user\nobs<|im_end|>\n<|im_start|>assistant\n"
    after_cut = TOK.decode(env_turn_ids(TOK, "obs", ""))
    assert after_cut == "<|im_end|>" + after_stop


def test_flatten_segments_masks_only_model_tokens():
    segs = [Segment("prompt", [1, 2]), Segment("model", [3, 4], [-0.1, -0.2]), Segment("env", [5]),
            Segment("model", [6], [-0.3])]
    assert flatten_segments(segs) == ([1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 0, 1])


def _scripted(replies):
    """A generate() that plays ``replies`` in order, ending each with <|im_end|> (or cut, if it ends with '~')."""
    replies = list(replies)
    seen_prompts = []

    def generate(prompt_ids):
        seen_prompts.append(list(prompt_ids))
        text = replies.pop(0)
        if text.endswith("~"):
            ids = TOK(text[:-1])["input_ids"]
            return ids, [-0.5] * len(ids), "length"
        ids = TOK(text)["input_ids"] + IM_END
        return ids, [-0.5] * len(ids), "stop"

    return generate, seen_prompts


def test_run_episode_segments_prompts_and_reward():
    task = SokobanTask(SokobanConfig(max_turns=4))
    problem = Problem(id="c", question="\n".join(CORRIDOR), answer=3, data=CORRIDOR)
    generate, prompts = _scripted(["Walk.\nMoves: R", "oops~", "Moves: R R"])
    ep = run_episode(task, problem, TOK, generate)
    assert ep.done and ep.turns == 3 and ep.reward == 1.0
    assert ep.assistant_texts == ["Walk.\nMoves: R", "oops", "Moves: R R"]
    assert [s.kind for s in ep.segments] == ["prompt", "model", "env", "model", "env", "model"]
    ids, mask = flatten_segments(ep.segments)
    # every prompt the model saw is exactly the concatenation of the segments before it
    for k, prompt in enumerate(prompts):
        before = [t for s in ep.segments[:2 * k + 1] for t in s.token_ids]
        assert prompt == before
    # the whole episode decodes to the chat template of the full conversation
    turns = task.first_turns(ep.observations[0])
    for text, obs in zip(ep.assistant_texts, ep.observations[1:]):
        turns += [("assistant", text), ("user", obs)]
    expected = TOK.apply_chat_template([{"role": r, "content": c} for r, c in turns[:-1]])
    assert TOK.decode(ids) == expected.rstrip("\n")
    # model tokens: exactly the sampled ones, and they carry log-probs
    model_ids = [t for t, m in zip(ids, mask) if m]
    assert TOK.decode(model_ids) == "Walk.\nMoves: R<|im_end|>oopsMoves: R R<|im_end|>"
    assert all(len(s.logprobs) == len(s.token_ids) for s in ep.segments if s.kind == "model")


def test_run_episode_stops_at_max_turns_and_context_limit():
    task = SokobanTask(SokobanConfig(max_turns=2))
    problem = Problem(id="c", question="", answer=3, data=CORRIDOR)
    generate, _ = _scripted(["Moves: L", "Moves: L", "Moves: R R R"])
    ep = run_episode(task, problem, TOK, generate)
    assert ep.turns == 2 and ep.done and ep.reward == 0.0
    generate, _ = _scripted(["Moves: R", "Moves: R R"])
    short = run_episode(task, problem, TOK, generate, max_context_tokens=10)
    assert short.turns == 0 and not short.done


def test_episode_tokens_with_the_real_tokenizer():
    """SmolLM2's own chat template and tokenizer: segments decode to the full conversation."""
    from common.default_model import ModelNotFoundError

    try:
        from learner.models import load_tokenizer
        from learner.models import resolve_model

        tok = load_tokenizer(resolve_model("default").hf_dir)
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    replies = iter(["Moves: R", "Moves: R R"])

    def generate(prompt_ids):
        ids = tok(next(replies), add_special_tokens=False)["input_ids"] + [eos]
        return ids, [-1.0] * len(ids), "stop"

    task = SokobanTask()
    problem = Problem(id="c", question="\n".join(CORRIDOR), answer=3, data=CORRIDOR)
    ep = run_episode(task, problem, tok, generate)
    assert ep.reward == 1.0 and ep.turns == 2
    ids, mask = flatten_segments(ep.segments)
    turns = task.first_turns(ep.observations[0]) + [("assistant", "Moves: R"), ("user", ep.observations[1]),
                                                     ("assistant", "Moves: R R")]
    text = tok.apply_chat_template([{"role": r, "content": c} for r, c in turns], tokenize=False)
    assert tok.decode(ids) == text.rstrip("\n")
    assert tok.decode([t for t, m in zip(ids, mask) if m]) == "Moves: R<|im_end|>Moves: R R<|im_end|>"
