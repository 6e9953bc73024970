"""Sokoban: rules, generator (solvable by construction), solver, parser, rewards, environment."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tasks.base import Problem
from tasks.sokoban import SokobanConfig, SokobanTask
from tasks.sokoban.actions import MAX_TURN_CHARS, moves_reward, parse_moves, replay_until_solved
from tasks.sokoban.env import SokobanEnv
from tasks.sokoban.generator import GeneratorConfig, draw_level, reverse_walk
from tasks.sokoban.level import Level, parse_level, replay
from tasks.sokoban.solver import solve, solve_with_stats

CORRIDOR = ("#######", "#@_$_.#", "#######")
"""Player, floor, box, floor, goal: solved by R R R."""


def test_render_parse_round_trip_and_symbols():
    rows = ("######", "#+_$_#", "#_*__#", "#.$__#", "######")
    level = parse_level(rows)
    assert level.rows() == rows and level.player == (1, 1) and level.player in level.goals
    assert level.boxes_on_goals() == 1 and not level.solved
    for bad in [("#@#", "##"), ("#@$#", "####"), ("#@@.$#",), ("#?.$@#",), ()]:
        with pytest.raises(ValueError):
            parse_level(bad)


def test_move_rules():
    level = parse_level(CORRIDOR)
    assert level.move("U") == level  # wall: unchanged
    after = level.move("R").move("R")  # walk, then push the box one cell
    assert after.player == (1, 3) and after.boxes == {(1, 4)}
    assert replay(level, "RRR").solved and replay(level, "RRRR") == replay(level, "RRR")  # box blocked by wall
    two = parse_level(("########", "#@$$_..#", "########"))
    assert two.move("R") == two  # box into box: unchanged
    assert not replay(level, "RRL").solved  # boxes are never pulled


def test_solver_is_optimal_on_hand_made_levels():
    assert solve(parse_level(CORRIDOR)) == "RRR"
    assert solve(parse_level(("#####", "#_._#", "#___#", "#_$_#", "#_@_#", "#####"))) == "UU"
    # box in a corner off the goal: unsolvable
    assert solve(parse_level(("#####", "#$_.#", "#_@_#", "#####"))) is None
    moves, states, capped = solve_with_stats(parse_level(("########", "#@_____#", "#_$$___#", "#___.._#", "########")), max_states=5)
    assert moves is None and capped


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), boxes=st.integers(1, 2), size=st.integers(5, 7),
       walls=st.sampled_from([0.0, 0.1, 0.2]))
def test_reverse_walk_levels_are_solvable_and_solutions_replay(seed, boxes, size, walls):
    cfg = GeneratorConfig(height=size, width=size, boxes=boxes, wall_fraction=walls, min_moves=1, max_moves=60)
    rng = random.Random(seed)
    drawn = None
    for _ in range(20):
        drawn = draw_level(cfg, rng)
        if drawn is not None:
            break
    assert drawn is not None
    level, solution = drawn
    assert not level.solved and 1 <= len(solution) <= 60
    assert replay(level, solution).solved
    assert solve(level) == solution  # deterministic and optimal: same answer twice


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 40))
def test_every_reverse_walk_is_solvable(seed, steps):
    rng = random.Random(seed)
    goals = frozenset({(2, 2), (3, 3)})
    walls = frozenset((r, c) for r in range(6) for c in range(6) if r in (0, 5) or c in (0, 5))
    start = reverse_walk(Level(6, 6, walls, goals, goals, (1, 1)), steps, 0.7, rng)
    moves = solve(start)
    assert moves is not None and replay(start, moves).solved


def test_task_problems_deterministic_split_disjoint_and_in_difficulty_window():
    t = SokobanTask(seed=2)
    assert t.problem("train", 3) == SokobanTask(seed=2).problem("train", 3)
    train = [t.problem("train", i) for i in range(150)]
    evals = [t.problem("eval", i) for i in range(60)]
    assert not {p.question for p in train} & {p.question for p in evals}
    for p in train + evals:
        level = parse_level(p.data)
        assert p.question == level.render() and not level.solved
        assert t.config.min_moves <= p.answer <= t.config.max_moves
        assert len(solve(level)) == p.answer
    assert len({p.id for p in train + evals}) == 210
    harder = SokobanTask(SokobanConfig(height=7, width=7, boxes=2, min_moves=6, max_moves=20, wall_fraction=0.1))
    assert all(6 <= harder.problem("train", i).answer <= 20 for i in range(5))
    with pytest.raises(ValueError):
        t.problem("test", 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SokobanConfig(format_reward=0.5, progress_reward=0.5)


# -- the strict move parser ------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("Moves: R", "R"), ("Push right twice.\nMoves: R R", "RR"), ("Moves: U, D, L, R", "UDLR"),
    ("Moves: up down Left RIGHT", "UDLR"), ("  Moves:r u.  ", "RU"), ("moves are below\n", None),
])
def test_parse_moves_accepts_well_formed(text, expected):
    assert parse_moves(text) == expected


@pytest.mark.parametrize("text", [
    "", "R R", "Moves:", "Moves: R X", "Moves: RR", "Moves: R\nMoves: R", "Moves: L\nthen Moves: R",
    "moves: R, so\nMoves: R", "Moves: R\nDone!", "**Moves:** R", "<moves>R</moves>", "Moves: <b>R</b>",
    "Moves: R" + " R" * 64, "MOVES = R\nMoves: R", "Moves: \u0280",
])
def test_parse_moves_rejects_malformed(text):
    assert parse_moves(text) is None


def test_parse_moves_rejects_huge_outputs():
    assert parse_moves("x" * MAX_TURN_CHARS + "\nMoves: R") is None
    assert parse_moves(None) is None  # type: ignore[arg-type]


def test_rewards_on_hand_made_answers():
    t = SokobanTask(SokobanConfig(format_reward=0.05, progress_reward=0.3))
    p = Problem(id="x", question="\n".join(CORRIDOR), answer=3, data=CORRIDOR)
    assert t.reward(p, "Moves: R R R") == 1.0
    assert t.reward(p, "Moves: R R R L L") == 1.0  # moves after the solution are ignored
    assert t.reward(p, "Moves: R R") == pytest.approx(0.05 + 0.3 * 0.5)  # box 2 -> 1 from the goal
    assert t.reward(p, "Moves: L") == pytest.approx(0.05)  # well-formed, no progress
    for bad in ["Moves: R R R\nMoves: R R R", "R R R", "Moves: R R R\nI think that's it", "x" * 5000 + "\nMoves: RRR"]:
        assert t.reward(p, bad) == 0.0
    assert solve(parse_level(p.data)) == "RRR"


def test_progress_never_reaches_one_without_solving():
    start = parse_level(("########", "#@_$__.#", "########"))
    assert moves_reward(start, "RR", True, 0.0, 0.99) < 1.0
    assert moves_reward(start, "RRRRR", True, 0.0, 0.3) == 1.0
    assert replay_until_solved(start, "RRRRRR").solved


def test_env_episode_and_replay_verification():
    t = SokobanTask(SokobanConfig(max_turns=3))
    p = Problem(id="x", question="\n".join(CORRIDOR), answer=3, data=CORRIDOR)
    env = t.make_env()
    obs = env.reset(p)
    assert "\n".join(CORRIDOR) in obs and "Boxes on goals: 0/1" in obs
    obs, done = env.step("I will walk.\nMoves: R")
    assert not done and "Applied 1 move" in obs
    obs, done = env.step("hmm")  # malformed: the board is unchanged, the turn is used
    assert not done and "unchanged" in obs
    obs, done = env.step("Moves: R R L")
    assert done and "Solved!" in obs and env.level.solved and env.moves == ["R", "R", "R"]
    with pytest.raises(RuntimeError):
        env.step("Moves: R")
    assert t.episode_reward(p, ["I will walk.\nMoves: R", "hmm", "Moves: R R L"]) == 1.0
    # the learner replays only the first max_turns turns and ignores a turn injected later
    assert t.episode_reward(p, ["Moves: L", "Moves: L", "Moves: L", "Moves: R R R"]) == 0.0
    assert t.episode_reward(p, ["no", "no"]) == 0.0


def test_env_ends_after_max_turns():
    env = SokobanEnv(max_turns=2)
    env.reset(Problem(id="x", question="", answer=3, data=CORRIDOR))
    obs, done = env.step("Moves: L")
    assert not done and "Applied 1 move" in obs and env.level.player == (1, 1)
    _, done = env.step("Moves: R")
    assert done and not env.level.solved and env.turns == 2


def test_messages_and_fewshot_examples_are_well_formed():
    from tasks.sokoban.task import FEWSHOT_EXAMPLES

    t = SokobanTask()
    p = t.problem("train", 0)
    msgs = t.messages(p)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert p.question in msgs[-1]["content"] and "Moves:" in msgs[-1]["content"]
    for rows, reply in FEWSHOT_EXAMPLES:
        level = parse_level(rows)
        assert replay(level, parse_moves(reply)).solved and len(parse_moves(reply)) == len(solve(level))
    boards = {t.problem(s, i).question for s in ("train", "eval") for i in range(100)}
    assert not boards & {"\n".join(rows) for rows, _ in FEWSHOT_EXAMPLES}
