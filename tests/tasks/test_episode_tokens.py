"""The flat episode record (token ids + mask) and its replay: honest records replay cleanly,
tampered ones are caught."""

from __future__ import annotations

import pytest

from node_agents.backends.base import SamplingParams
from node_agents.episodes import run_group_episodes
from tasks.base import Problem
from tasks.episode_tokens import episode_prompt, mask_runs, model_turn_text, replay_record, special_ids
from tasks.interface import env_turn_ids
from tasks.sokoban import SokobanConfig, SokobanTask

CORRIDOR = Problem("corridor", "", 3, ("#######", "#@_$_.#", "#######"))  # R R R solves it


def episodes(tok, backend_cls, replies, max_turns=3, n=2, budget=10_000):
    task = SokobanTask(SokobanConfig(max_turns=max_turns))
    prompt = episode_prompt(task, tok, CORRIDOR)
    backend = backend_cls(tok, replies)
    eps = run_group_episodes(backend, tok, task, CORRIDOR, prompt, n, SamplingParams(1.0, 1.0, 32, 7),
                             max_turns, budget)
    return task, eps


def test_mask_runs():
    assert mask_runs([1, 1, 0, 1]) == [(1, 0, 2), (0, 2, 3), (1, 3, 4)]
    assert mask_runs([1]) == [(1, 0, 1)]
    assert mask_runs([]) == []


def test_model_turn_text_strips_a_final_special_token_only(chatml_tokenizer):
    tok = chatml_tokenizer
    specials = special_ids(tok)
    ids = tok("Moves: R")["input_ids"]
    assert model_turn_text(tok, ids + [tok.all_special_ids[1]], specials) == ("Moves: R", "<|im_end|>")
    assert model_turn_text(tok, ids, specials) == ("Moves: R", "")


def test_honest_episode_replays_and_solves(chatml_tokenizer, scripted_backend):
    task, eps = episodes(chatml_tokenizer, scripted_backend, ["Moves: R"])
    for ep in eps:
        assert ep.turns == 3 and ep.mask[0] == 1 and ep.mask[-1] == 1
        assert [v for v, _, _ in mask_runs(ep.mask)] == [1, 0, 1, 0, 1]
        rep = replay_record(task, CORRIDOR, chatml_tokenizer, ep.token_ids, ep.mask)
        assert rep.error is None and rep.done and rep.texts == ["Moves: R"] * 3
        assert task.episode_reward(CORRIDOR, rep.texts) == 1.0


def test_env_tokens_are_exactly_the_rendered_observation(chatml_tokenizer, scripted_backend):
    tok = chatml_tokenizer
    task, (ep, _) = episodes(tok, scripted_backend, ["Moves: R"])
    (_, s, e) = mask_runs(ep.mask)[1]
    env = task.make_env()
    env.reset(CORRIDOR)
    obs, _ = env.step("Moves: R")
    assert ep.token_ids[s:e] == env_turn_ids(tok, obs, "<|im_end|>")
    assert "Applied 1 move(s)." in tok.decode(ep.token_ids[s:e])


def test_tampered_records_are_rejected(chatml_tokenizer, scripted_backend):
    tok = chatml_tokenizer
    task, (ep, _) = episodes(tok, scripted_backend, ["Moves: R"])
    ids, mask = list(ep.token_ids), list(ep.mask)
    (_, s, _) = mask_runs(mask)[1]

    forged = ids[:s + 20] + [ord("$")] + ids[s + 21:]  # a board character changed in an observation
    assert "differ" in replay_record(task, CORRIDOR, tok, forged, mask).error
    assert replay_record(task, CORRIDOR, tok, ids, [0] + mask[1:]).error  # starts with an env token
    assert replay_record(task, CORRIDOR, tok, ids[:-1], mask).error  # lengths differ
    # the episode was solved at turn 3: a fourth turn cannot follow
    more = env_turn_ids(tok, "whatever", "<|im_end|>")
    extra = tok("Moves: L")["input_ids"]
    err = replay_record(task, CORRIDOR, tok, ids + more + extra, mask + [0] * len(more) + [1] * len(extra)).error
    assert err is not None and "limit" in err  # 4 model turns > max_turns 3


def test_episode_stops_at_done_before_max_turns(chatml_tokenizer, scripted_backend):
    tok = chatml_tokenizer
    task, eps = episodes(tok, scripted_backend, ["Moves: R R R"], max_turns=4)
    assert all(ep.turns == 1 and set(ep.mask) == {1} for ep in eps)
    rep = replay_record(task, CORRIDOR, tok, eps[0].token_ids, eps[0].mask)
    assert rep.error is None and rep.done


def test_environment_turn_after_done_is_rejected(chatml_tokenizer, scripted_backend):
    tok = chatml_tokenizer
    task, (ep, _) = episodes(tok, scripted_backend, ["Moves: R R R"], max_turns=4)
    more = env_turn_ids(tok, "x", "<|im_end|>")
    extra = tok("Moves: L")["input_ids"]
    err = replay_record(task, CORRIDOR, tok, ep.token_ids + more + extra,
                        ep.mask + [0] * len(more) + [1] * len(extra)).error
    assert err is not None and "ended" in err


@pytest.mark.parametrize("budget", [5, 40, 80])
def test_budget_bounds_the_record_and_it_still_replays(chatml_tokenizer, scripted_backend, budget):
    tok = chatml_tokenizer
    task, eps = episodes(tok, scripted_backend, ["Moves: L", "Moves: R"], budget=budget)
    for ep in eps:
        assert 1 <= len(ep.token_ids) <= budget and ep.mask[-1] == 1
        assert replay_record(task, CORRIDOR, tok, ep.token_ids, ep.mask).error is None
