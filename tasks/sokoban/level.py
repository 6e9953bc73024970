"""Sokoban levels: an immutable state, the move rules, text rendering and replay.

Coordinates are ``(row, col)``; row 0 is the top. Symbols (standard Sokoban, with ``_`` for
floor so that every cell is a visible character): ``#`` wall, ``_`` floor, ``.`` goal,
``$`` box, ``*`` box on a goal, ``@`` player, ``+`` player on a goal.

Rules: a move steps the player one cell up/down/left/right. Walking into a wall, or pushing a
box into a wall or another box, leaves the state unchanged (the move still counts as made).
A box can only be pushed, never pulled. The level is solved when every box is on a goal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

Pos = tuple[int, int]

DIRECTIONS: dict[str, Pos] = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
"""Move letter -> (d_row, d_col)."""

WALL, FLOOR, GOAL, BOX, BOX_ON_GOAL, PLAYER, PLAYER_ON_GOAL = "#", "_", ".", "$", "*", "@", "+"
_SYMBOLS = {WALL, FLOOR, GOAL, BOX, BOX_ON_GOAL, PLAYER, PLAYER_ON_GOAL}


@dataclass(frozen=True)
class Level:
    """A full Sokoban state. ``walls`` include the border; every non-wall cell is floor."""

    height: int
    width: int
    walls: frozenset[Pos]
    goals: frozenset[Pos]
    boxes: frozenset[Pos]
    player: Pos

    def __post_init__(self) -> None:
        if len(self.boxes) != len(self.goals) or not self.boxes:
            raise ValueError("a level needs at least one box and as many goals as boxes")
        cells = self.boxes | self.goals | {self.player}
        if any(not (0 <= r < self.height and 0 <= c < self.width) for r, c in cells):
            raise ValueError("a box, goal or the player is outside the board")
        if (self.boxes | self.goals | {self.player}) & self.walls:
            raise ValueError("a box, goal or the player is on a wall")
        if self.player in self.boxes:
            raise ValueError("the player stands on a box")

    @property
    def solved(self) -> bool:
        return self.boxes == self.goals

    def move(self, d: str) -> "Level":
        """The state after one move ``d`` in ``DIRECTIONS`` (unchanged if blocked)."""
        dr, dc = DIRECTIONS[d]
        r, c = self.player
        nxt = (r + dr, c + dc)
        if nxt in self.walls:
            return self
        if nxt in self.boxes:
            beyond = (nxt[0] + dr, nxt[1] + dc)
            if beyond in self.walls or beyond in self.boxes:
                return self
            boxes = (self.boxes - {nxt}) | {beyond}
            return Level(self.height, self.width, self.walls, self.goals, frozenset(boxes), nxt)
        return Level(self.height, self.width, self.walls, self.goals, self.boxes, nxt)

    def rows(self) -> tuple[str, ...]:
        """The board as text rows (see the module docstring for the symbols)."""
        out = []
        for r in range(self.height):
            line = []
            for c in range(self.width):
                p = (r, c)
                if p in self.walls:
                    line.append(WALL)
                elif p == self.player:
                    line.append(PLAYER_ON_GOAL if p in self.goals else PLAYER)
                elif p in self.boxes:
                    line.append(BOX_ON_GOAL if p in self.goals else BOX)
                else:
                    line.append(GOAL if p in self.goals else FLOOR)
            out.append("".join(line))
        return tuple(out)

    def render(self) -> str:
        return "\n".join(self.rows())

    def boxes_on_goals(self) -> int:
        return len(self.boxes & self.goals)

    def box_distance(self) -> int:
        """Sum over boxes of the Manhattan distance to the nearest goal (0 when solved)."""
        return sum(min(abs(b[0] - g[0]) + abs(b[1] - g[1]) for g in self.goals) for b in self.boxes)


def parse_level(rows: Iterable[str]) -> Level:
    """The inverse of :meth:`Level.rows`. Raises ``ValueError`` on a malformed board."""
    rows = list(rows)
    if not rows or len({len(r) for r in rows}) != 1:
        raise ValueError("a board needs rows of equal, non-zero length")
    walls, goals, boxes, players = set(), set(), set(), []
    for r, line in enumerate(rows):
        for c, ch in enumerate(line):
            if ch not in _SYMBOLS:
                raise ValueError(f"unknown board symbol {ch!r}")
            p = (r, c)
            if ch == WALL:
                walls.add(p)
            if ch in (GOAL, BOX_ON_GOAL, PLAYER_ON_GOAL):
                goals.add(p)
            if ch in (BOX, BOX_ON_GOAL):
                boxes.add(p)
            if ch in (PLAYER, PLAYER_ON_GOAL):
                players.append(p)
    if len(players) != 1:
        raise ValueError("a board needs exactly one player")
    return Level(len(rows), len(rows[0]), frozenset(walls), frozenset(goals), frozenset(boxes), players[0])


def replay(level: Level, moves: Iterable[str]) -> Level:
    """The state after applying ``moves`` (letters of ``DIRECTIONS``) from ``level``."""
    for m in moves:
        level = level.move(m)
    return level
