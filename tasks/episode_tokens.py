"""A multi-turn episode as one flat token record, and its replay (both sides use this).

On the wire an episode is the tokens after the initial prompt, ``token_ids``, with a ``mask``
(1 where the model sampled the token, 0 where the environment appended it): model turn,
environment turn, model turn, ..., always starting and ending with a model turn. The node
builds it (``node_agents.episodes``); the learner checks it with :func:`replay_record`, which
rebuilds every environment turn from the model's own turns and the task's environment, so a
node can neither invent observations nor report a reward.

One rule decides how a model turn reads, on both sides: when its last token is one of the
tokenizer's special tokens (e.g. ``<|im_end|>``) the turn stopped there; its text is the decoded
turn without special tokens and the stop token's text is not repeated by the environment
turn (:func:`tasks.interface.env_turn_ids`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from tasks.base import Problem
from tasks.interface import chat_prompt, env_turn_ids


def episode_prompt(task: Any, tokenizer: Any, problem: Problem) -> list[int]:
    """Token ids of the first model turn's prompt: the task's opening turns with the first
    observation, rendered with the chat template."""
    return chat_prompt(tokenizer, task.first_turns(task.make_env().reset(problem)))


def special_ids(tokenizer: Any) -> frozenset[int]:
    """Ids of the tokenizer's special tokens (end of turn, start of turn, end of text ...)."""
    return frozenset(int(i) for i in getattr(tokenizer, "all_special_ids", ()) or ())


def model_turn_text(tokenizer: Any, ids: Sequence[int], specials: frozenset[int]) -> tuple[str, str]:
    """(text of the turn, text of its stop token or ``""``) under the module's rule."""
    ids = list(ids)
    if ids and ids[-1] in specials:
        stop = tokenizer.decode([ids[-1]], skip_special_tokens=False)
        return tokenizer.decode(ids[:-1], skip_special_tokens=True), stop
    return tokenizer.decode(ids, skip_special_tokens=True), ""


def mask_runs(mask: Sequence[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of equal mask values as (value, start, end) with ``end`` exclusive."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((int(mask[start]), start, i))
            start = i
    return runs


@dataclass
class Replay:
    """The outcome of :func:`replay_record`."""

    texts: list[str]
    """The model's turns as text, in order (what the reward replays)."""
    done: bool
    """Whether the environment ended the episode (solved or out of turns)."""
    error: str | None = None
    """Why the record is not an honest episode of this task, or ``None``."""


def replay_record(task: Any, problem: Problem, tokenizer: Any, token_ids: Sequence[int],
                  mask: Sequence[int]) -> Replay:
    """Rebuild the episode of ``problem`` from its record and check every environment turn.

    The record must alternate model and environment runs, start and end with a model turn,
    hold at most ``task.max_turns`` model turns and never continue after the environment said
    ``done``; each environment run must equal the tokens this side computes for the
    observation that the model's previous turn produced.
    """
    if len(token_ids) != len(mask) or not mask:
        return Replay([], False, "mask must be non-empty and as long as the tokens")
    runs = mask_runs(mask)
    if runs[0][0] != 1 or runs[-1][0] != 1:
        return Replay([], False, "an episode starts and ends with a model turn")
    model_runs = [r for r in runs if r[0] == 1]
    if len(model_runs) > task.max_turns:
        return Replay([], False, f"{len(model_runs)} model turns, limit {task.max_turns}")
    specials = special_ids(tokenizer)
    env = task.make_env()
    env.reset(problem)
    texts: list[str] = []
    done = False
    for k, (_, start, end) in enumerate(model_runs):
        if done:
            return Replay(texts, done, f"turn {k + 1} follows the end of the episode")
        text, stop_text = model_turn_text(tokenizer, token_ids[start:end], specials)
        texts.append(text)
        obs, done = env.step(text)
        if k + 1 < len(model_runs):
            env_start, env_end = end, model_runs[k + 1][1]
            if done:
                return Replay(texts, done, f"environment tokens after the episode ended (turn {k + 1})")
            if list(token_ids[env_start:env_end]) != env_turn_ids(tokenizer, obs, stop_text):
                return Replay(texts, done, f"environment tokens after turn {k + 1} differ from the replay")
    return Replay(texts, done)
