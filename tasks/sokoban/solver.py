"""Breadth-first Sokoban solver: the shortest move sequence, or ``None``.

The search runs over full states (player cell, box cells), one move per edge, so the first
solution found is optimal in moves. Blocked moves are not expanded (they lead to the same
state). Boxes pushed into a corner that is not a goal are pruned (such a box can never move
again). ``max_states`` bounds the work; a search that hits it returns ``None`` and says so
through :func:`solve_with_stats`.
"""

from __future__ import annotations

from collections import deque

from tasks.sokoban.level import DIRECTIONS, Level, Pos

MAX_STATES = 200_000
"""Default cap on visited states (a few seconds of pure Python at most)."""


def _dead_corner(level: Level, p: Pos) -> bool:
    """A non-goal cell with walls on two orthogonal sides: a box there is stuck for ever."""
    if p in level.goals:
        return False
    r, c = p
    up, down = (r - 1, c) in level.walls, (r + 1, c) in level.walls
    left, right = (r, c - 1) in level.walls, (r, c + 1) in level.walls
    return (up or down) and (left or right)


def solve_with_stats(level: Level, max_states: int = MAX_STATES) -> tuple[str | None, int, bool]:
    """(moves or None, states visited, whether the cap was hit)."""
    if level.solved:
        return "", 1, False
    start = (level.player, level.boxes)
    parent: dict[tuple[Pos, frozenset[Pos]], tuple[tuple[Pos, frozenset[Pos]], str] | None] = {start: None}
    queue = deque([start])
    walls = level.walls
    while queue:
        state = queue.popleft()
        (r, c), boxes = state
        for d, (dr, dc) in DIRECTIONS.items():
            nxt = (r + dr, c + dc)
            if nxt in walls:
                continue
            new_boxes = boxes
            if nxt in boxes:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if beyond in walls or beyond in boxes or _dead_corner(level, beyond):
                    continue
                new_boxes = (boxes - {nxt}) | {beyond}
            child = (nxt, new_boxes)
            if child in parent:
                continue
            parent[child] = (state, d)
            if new_boxes == level.goals:
                return _path(parent, child), len(parent), False
            if len(parent) >= max_states:
                return None, len(parent), True
            queue.append(child)
    return None, len(parent), False


def _path(parent, state) -> str:
    moves = []
    while parent[state] is not None:
        state, d = parent[state]
        moves.append(d)
    return "".join(reversed(moves))


def solve(level: Level, max_states: int = MAX_STATES) -> str | None:
    """The shortest solution as a string of move letters (``""`` if already solved), or
    ``None`` when the level is unsolvable or the search exceeded ``max_states``."""
    return solve_with_stats(level, max_states)[0]
