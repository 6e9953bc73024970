"""Sokoban as a task: single-turn (one plan, replayed) and multi-turn (an environment).

A problem is a generated level (:mod:`tasks.sokoban.generator`): ``question`` is the board text,
``data`` its rows, ``answer`` the optimal number of moves. Draws are keyed by
``stable_hash(config, seed, split, index, attempt)``; the split of a level is a hash bucket of
its board text (bucket 0 = eval), and a draw that lands in the other split is redrawn, so no
board appears in both splits.

Single-turn: the model answers with the whole plan on a ``Moves:`` line; the reward replays it.
Multi-turn: :meth:`SokobanTask.make_env` / :meth:`first_turns` / :meth:`episode_reward` follow
the contract of :mod:`tasks.interface`; the learner's reward replays every assistant turn's
moves from the start level, trusting nothing the node computed.

Default difficulty: one box in a 6 x 6 room (4 x 4 floor), optimal solutions of 1-4 moves, two
answer-only worked examples in the prompt, progress shaping 0.3. Measured with llama.cpp
(SmolLM2-135M Q4_1, temperature 1.0, 64 tokens, 16 train levels, single-turn): mean reward
0.06, 1 of 16 solved; with one worked example that explained its move first it was 0 of 16.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

from tasks.base import Problem, Split, chat_messages, check_coordinates, config_key, render_prompt as _render_messages, stable_hash
from tasks.interface import Role
from tasks.sokoban.actions import MAX_MOVES, episode_moves, moves_reward, parse_moves
from tasks.sokoban.env import SokobanEnv, observation
from tasks.sokoban.generator import GeneratorConfig, draw_level
from tasks.sokoban.level import parse_level

MAX_ATTEMPTS = 10_000
"""Redraw limit when looking for a level in the difficulty window and the requested split."""


@dataclass(frozen=True)
class SokobanConfig(GeneratorConfig):
    """Level knobs (inherited from :class:`GeneratorConfig`) plus prompt and reward knobs."""

    format_reward: float = 0.0
    """Reward for a well-formed but unsuccessful answer (see ``tasks.sokoban.actions``)."""
    progress_reward: float = 0.3
    """Weight of the box-distance progress shaping of an unsolved final state."""
    max_turns: int = 4
    """Assistant turns per multi-turn episode."""
    max_answer_moves: int = MAX_MOVES
    """Most moves in one ``Moves:`` line (a longer line is malformed)."""
    fewshot: int = 2
    """Worked examples (answer only) shown as earlier chat turns in the single-turn prompt (0..2)."""
    eval_buckets: int = 16
    """Board-hash buckets; bucket 0 is the eval split."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.format_reward < 0 or self.progress_reward < 0 or self.format_reward + self.progress_reward >= 1:
            raise ValueError("need format_reward, progress_reward >= 0 with a sum below 1")
        if self.max_turns < 1 or self.max_answer_moves < 1 or self.eval_buckets < 2:
            raise ValueError("need max_turns >= 1, max_answer_moves >= 1 and eval_buckets >= 2")
        if not (0 <= self.fewshot <= len(FEWSHOT_EXAMPLES)):
            raise ValueError(f"fewshot must be in 0..{len(FEWSHOT_EXAMPLES)}")


RULES = (
    "You are playing Sokoban. Symbols: # wall, _ floor, . goal, $ box, * box on a goal, "
    "@ you, + you on a goal. Each move is U (up), D (down), L (left) or R (right). Walking into "
    "a box pushes it one cell if the cell behind it is free; boxes cannot be pulled. "
    "Put every box on a goal."
)
"""System message: the rules and symbols."""

FORMAT_INSTRUCTION = 'Give your moves on the last line as "Moves: " followed by letters, e.g. "Moves: U R".'
"""The strict answer format, appended to every board."""

MULTI_TURN_NOTE = "After each answer you will see the new board; you have {turns} turn(s)."
"""Added to the system message of a multi-turn episode."""

FEWSHOT_EXAMPLES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("#######", "#_____#", "#_@$._#", "#_____#", "#######"), "Moves: R"),
    (("#####", "#_._#", "#___#", "#_$_#", "#_@_#", "#####"), "Moves: U U"),
)
"""(board rows, assistant reply); sizes the default generator never draws (7x5, 6x5)."""

PROMPT_KNOBS = ("format_reward", "progress_reward", "max_turns", "max_answer_moves", "fewshot")
"""Fields that change prompts or rewards but not the levels."""


class SokobanTask:
    """Sokoban levels with replay-verified rewards; see the module docstring."""

    name = "sokoban"

    def __init__(self, config: SokobanConfig | None = None, seed: int = 0) -> None:
        self.config = config or SokobanConfig()
        self.seed = int(seed)
        self.max_turns = self.config.max_turns
        self._key, self._tag = config_key("sokoban", self.config, PROMPT_KNOBS)

    # -- problems ---------------------------------------------------------------------------
    def split_of(self, board: str) -> Split:
        return "eval" if stable_hash("sokoban-split", board) % self.config.eval_buckets == 0 else "train"

    def problem(self, split: Split, index: int) -> Problem:
        check_coordinates(split, index)
        for attempt in range(MAX_ATTEMPTS):
            rng = random.Random(stable_hash("sokoban", self._key, self.seed, split, index, attempt))
            drawn = draw_level(self.config, rng)
            if drawn is None:
                continue
            level, solution = drawn
            board = level.render()
            if self.split_of(board) == split:
                return Problem(id=f"sokoban-{self._tag}-s{self.seed}-{split}-{index}", question=board,
                               answer=len(solution), data=level.rows())
        raise RuntimeError("no level found in the difficulty window for this split; widen min_moves..max_moves")

    # -- single turn ------------------------------------------------------------------------
    def messages(self, problem: Problem) -> list[dict[str, str]]:
        examples = [(f"{observation(parse_level(rows))}\n{FORMAT_INSTRUCTION}", reply)
                    for rows, reply in FEWSHOT_EXAMPLES[:self.config.fewshot]]
        return chat_messages(RULES, examples, f"{observation(parse_level(problem.data))}\n{FORMAT_INSTRUCTION}")

    def render_prompt(self, tokenizer: Any, problem: Problem) -> list[int]:
        return _render_messages(tokenizer, self.messages(problem))

    def reward(self, problem: Problem, completion_text: str) -> float:
        """The whole plan in one turn, replayed from the start level (see ``actions``)."""
        moves = parse_moves(completion_text, self.config.max_answer_moves)
        return moves_reward(parse_level(problem.data), moves or "", moves is not None,
                            self.config.format_reward, self.config.progress_reward)

    # -- multi turn -------------------------------------------------------------------------
    def make_env(self) -> SokobanEnv:
        return SokobanEnv(self.config.max_turns, self.config.max_answer_moves)

    def first_turns(self, observation_text: str) -> list[tuple[Role, str]]:
        system = f"{RULES} {MULTI_TURN_NOTE.format(turns=self.config.max_turns)}"
        return [("system", system), ("user", f"{observation_text}\n{FORMAT_INSTRUCTION}")]

    def episode_reward(self, problem: Problem, assistant_texts: Sequence[str]) -> float:
        """Replays the moves of every well-formed turn (at most ``max_turns`` turns)."""
        turns = list(assistant_texts)[:self.config.max_turns]
        moves, ok = episode_moves(turns, self.config.max_answer_moves)
        return moves_reward(parse_level(problem.data), moves, ok > 0,
                            self.config.format_reward, self.config.progress_reward)

    def solved(self, problem: Problem, completion_text: str) -> bool:
        """Whether a single-turn answer solves the level (the evaluator's accuracy)."""
        return self.reward(problem, completion_text) >= 1.0
