"""The strict parser of a model's Sokoban moves, and the reward on a final move list.

Answer format (one assistant turn): the last non-empty line is ``Moves: <m> <m> ...`` where
each ``<m>`` is ``U``/``D``/``L``/``R`` or ``up``/``down``/``left``/``right`` (any case),
separated by spaces and/or commas, 1..``max_moves`` of them. Nothing else in the turn may look
like a second move list (a ``moves:`` marker in any case occurs exactly once), and a turn longer
than ``MAX_TURN_CHARS`` is rejected unread. A malformed turn yields no moves.

Reward on the final state after replaying the parsed moves from the start, stopping at the first
solved state (moves after a solution are ignored, as in the environment); documented shaping:

- 1.0 when every box is on a goal;
- otherwise ``format_reward`` if at least one turn was well-formed, plus
  ``progress_reward * max(0, (d0 - d1) / d0)`` where ``d`` is the sum over boxes of the
  Manhattan distance to the nearest goal at the start (``d0``) and at the end (``d1``);
- 0.0 when no turn was well-formed.

Progress counts only the final state, so pushing a box forth and back earns nothing, and it is
capped below 1 (``format_reward + progress_reward < 1``), so only a solution reaches 1.0.
"""

from __future__ import annotations

import re
from typing import Sequence

from tasks.sokoban.level import Level

MAX_TURN_CHARS = 4000
"""A turn longer than this (characters) is malformed without being parsed."""

MAX_MOVES = 64
"""Default cap on moves in one ``Moves:`` line (longer lists are malformed)."""

_WORDS = {"u": "U", "up": "U", "d": "D", "down": "D", "l": "L", "left": "L", "r": "R", "right": "R"}
_LINE = re.compile(r"Moves:[ \t]*(.*?)[ \t]*\.?", re.ASCII | re.IGNORECASE)
_MARKER = re.compile(r"moves[ \t]*[:=]", re.IGNORECASE)
_SEP = re.compile(r"[ \t]*,[ \t]*|[ \t]+", re.ASCII)


def parse_moves(text: str, max_moves: int = MAX_MOVES) -> str | None:
    """The move letters of a well-formed turn (e.g. ``"URRD"``), or ``None`` if malformed."""
    if not isinstance(text, str) or len(text) > MAX_TURN_CHARS:
        return None
    lines = [ln.strip() for ln in text.strip().splitlines()]
    if not lines or not lines[-1] or len(_MARKER.findall(text)) != 1:
        return None
    m = _LINE.fullmatch(lines[-1])
    if m is None or not lines[-1].startswith("Moves:"):
        return None
    body = m.group(1)
    if not body:
        return None
    tokens = _SEP.split(body)
    if any(t.lower() not in _WORDS for t in tokens) or len(tokens) > max_moves:
        return None
    return "".join(_WORDS[t.lower()] for t in tokens)


def moves_reward(start: Level, moves: str, well_formed: bool, format_reward: float, progress_reward: float) -> float:
    """The reward of the module docstring for the final state after ``moves`` from ``start``."""
    if not well_formed:
        return 0.0
    end = replay_until_solved(start, moves)
    if end.solved:
        return 1.0
    d0, d1 = start.box_distance(), end.box_distance()
    progress = max(0.0, (d0 - d1) / d0) if d0 > 0 else 0.0
    return float(format_reward + progress_reward * progress)


def replay_until_solved(start: Level, moves: str) -> Level:
    """Apply ``moves`` from ``start``, stopping at the first solved state (later moves are
    ignored, as the environment does)."""
    level = start
    for m in moves:
        if level.solved:
            break
        level = level.move(m)
    return level


def episode_moves(turns: Sequence[str], max_moves: int = MAX_MOVES) -> tuple[str, int]:
    """All moves of the well-formed turns in order, and how many turns were well-formed."""
    moves, ok = [], 0
    for text in turns:
        parsed = parse_moves(text, max_moves)
        if parsed is not None:
            moves.append(parsed)
            ok += 1
    return "".join(moves), ok
