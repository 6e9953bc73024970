"""The multi-turn Sokoban environment (see ``tasks.interface`` for the episode contract).

Each assistant turn is parsed with :func:`tasks.sokoban.actions.parse_moves`; its moves are
applied in order (stopping early once the level is solved); the next observation is the board
after the turn plus a one-line status. A malformed turn leaves the board unchanged and the
observation says why. The episode ends when the level is solved or after ``max_turns`` turns.
"""

from __future__ import annotations

from tasks.base import Problem
from tasks.sokoban.actions import MAX_MOVES, parse_moves
from tasks.sokoban.level import Level, parse_level


def observation(level: Level, note: str = "") -> str:
    """The board text followed by a status line (and ``note``, if any, first)."""
    status = f"Boxes on goals: {level.boxes_on_goals()}/{len(level.boxes)}."
    head = f"{note}\n" if note else ""
    return f"{head}{level.render()}\n{status}"


class SokobanEnv:
    """One episode on one level; deterministic."""

    def __init__(self, max_turns: int = 4, max_moves: int = MAX_MOVES) -> None:
        if max_turns < 1 or max_moves < 1:
            raise ValueError("max_turns and max_moves must be >= 1")
        self.max_turns = max_turns
        self.max_moves = max_moves
        self.level: Level | None = None
        self.moves: list[str] = []
        self.turns = 0
        self.done = False

    def reset(self, problem: Problem) -> str:
        self.level = parse_level(problem.data)
        self.moves, self.turns, self.done = [], 0, False
        return observation(self.level)

    def step(self, action_text: str) -> tuple[str, bool]:
        if self.level is None:
            raise RuntimeError("step() before reset()")
        if self.done:
            raise RuntimeError("step() after the episode ended")
        self.turns += 1
        parsed = parse_moves(action_text, self.max_moves)
        if parsed is None:
            note = 'No valid "Moves:" line; the board is unchanged.'
        else:
            for m in parsed:
                self.level = self.level.move(m)
                self.moves.append(m)
                if self.level.solved:
                    break
            note = "Solved!" if self.level.solved else f"Applied {len(parsed)} move(s)."
        self.done = self.level.solved or self.turns >= self.max_turns
        return observation(self.level, note), self.done
