"""Procedural Sokoban levels that are solvable by construction (reverse play).

1. A rectangular room of ``height`` x ``width`` cells, border included; ``wall_fraction`` of
   the interior becomes extra wall cells, redrawn until the floor is one connected region.
2. ``boxes`` goals are placed on floor cells and a box is put on each (a solved state); the
   player stands on a free floor cell next to a box (any free cell if none is).
3. 1..``reverse_steps`` reverse moves (uniform): the player steps to a free neighbour and, with
   probability ``pull_prob``, pulls the box that was directly behind it into its old cell.
   Every pull is the exact inverse of a forward push, so the forward level is solvable by
   undoing the walk.
4. The BFS solver (:mod:`tasks.sokoban.solver`) then measures the optimal solution; a level is
   kept only if it is not already solved and its optimal length lies in
   ``[min_moves, max_moves]`` (the difficulty knob); otherwise the draw is repeated.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tasks.sokoban.level import DIRECTIONS, Level, Pos
from tasks.sokoban.solver import solve


@dataclass(frozen=True)
class GeneratorConfig:
    """Size, boxes and difficulty of generated levels."""

    height: int = 6
    """Board rows, border walls included (>= 4)."""
    width: int = 6
    """Board columns, border walls included (>= 4)."""
    boxes: int = 1
    """Boxes (= goals) per level."""
    wall_fraction: float = 0.0
    """Fraction of interior cells turned into extra walls (the floor stays connected)."""
    reverse_steps: int = 30
    """Most reverse moves walked from the solved state (each draw walks 1..reverse_steps)."""
    pull_prob: float = 0.6
    """Probability that a reverse move pulls the box behind the player."""
    min_moves: int = 1
    """Shortest accepted optimal solution, in moves."""
    max_moves: int = 4
    """Longest accepted optimal solution, in moves."""
    max_solver_states: int = 200_000
    """Solver cap when measuring a candidate (a capped candidate is discarded)."""

    def __post_init__(self) -> None:
        if self.height < 4 or self.width < 4:
            raise ValueError("height and width must be >= 4 (border walls included)")
        interior = (self.height - 2) * (self.width - 2)
        if not (1 <= self.boxes and 2 * self.boxes + 1 <= interior):
            raise ValueError("need 1 <= boxes and room for the boxes, their goals and the player")
        if not (0.0 <= self.wall_fraction <= 0.5):
            raise ValueError("wall_fraction must be in [0, 0.5]")
        if not (1 <= self.min_moves <= self.max_moves):
            raise ValueError("need 1 <= min_moves <= max_moves")
        if self.reverse_steps < 1 or not (0.0 < self.pull_prob <= 1.0):
            raise ValueError("need reverse_steps >= 1 and pull_prob in (0, 1]")


def _connected(floor: set[Pos]) -> bool:
    if not floor:
        return False
    start = next(iter(floor))
    seen, stack = {start}, [start]
    while stack:
        r, c = stack.pop()
        for dr, dc in DIRECTIONS.values():
            n = (r + dr, c + dc)
            if n in floor and n not in seen:
                seen.add(n)
                stack.append(n)
    return len(seen) == len(floor)


def _room(cfg: GeneratorConfig, rng: random.Random) -> tuple[frozenset[Pos], list[Pos]]:
    border = {(r, c) for r in range(cfg.height) for c in range(cfg.width)
              if r in (0, cfg.height - 1) or c in (0, cfg.width - 1)}
    interior = sorted((r, c) for r in range(1, cfg.height - 1) for c in range(1, cfg.width - 1))
    n_walls = int(round(cfg.wall_fraction * len(interior)))
    for _ in range(100):
        extra = set(rng.sample(interior, n_walls)) if n_walls else set()
        floor = set(interior) - extra
        if len(floor) >= 2 * cfg.boxes + 1 and _connected(floor):
            return frozenset(border | extra), sorted(floor)
    return frozenset(border), interior  # no extra walls rather than a disconnected room


def reverse_walk(level: Level, steps: int, pull_prob: float, rng: random.Random) -> Level:
    """Walk ``steps`` reverse moves from ``level`` (pulls instead of pushes)."""
    walls = level.walls
    player, boxes = level.player, set(level.boxes)
    dirs = list(DIRECTIONS.values())
    for _ in range(steps):
        dr, dc = rng.choice(dirs)
        nxt = (player[0] + dr, player[1] + dc)
        if nxt in walls or nxt in boxes:
            continue
        behind = (player[0] - dr, player[1] - dc)
        if behind in boxes and rng.random() < pull_prob:
            boxes.remove(behind)
            boxes.add(player)
        player = nxt
    return Level(level.height, level.width, walls, level.goals, frozenset(boxes), player)


def draw_level(cfg: GeneratorConfig, rng: random.Random) -> tuple[Level, str] | None:
    """One candidate: (level, optimal solution) or ``None`` when it misses the difficulty window."""
    walls, floor = _room(cfg, rng)
    goals = frozenset(rng.sample(floor, cfg.boxes))
    # start beside a box, so the first reverse moves can pull it (a random walk far from the
    # boxes would mostly leave the level solved)
    near = sorted({(r + dr, c + dc) for r, c in goals for dr, dc in DIRECTIONS.values()} & set(floor) - goals)
    player = rng.choice(near or sorted(set(floor) - goals))
    solved = Level(cfg.height, cfg.width, walls, goals, goals, player)
    level = reverse_walk(solved, rng.randint(1, cfg.reverse_steps), cfg.pull_prob, rng)
    if level.solved:
        return None
    solution = solve(level, cfg.max_solver_states)
    if solution is None or not (cfg.min_moves <= len(solution) <= cfg.max_moves):
        return None
    return level, solution
