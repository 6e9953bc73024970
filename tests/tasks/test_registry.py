"""The task registry: names, options, clear errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tasks.registry import TASKS, make_task


@dataclass
class Cfg:
    name: str
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)


def test_every_registered_task_builds_and_poses_problems():
    assert set(TASKS) == {"arith", "math", "knights", "sokoban"}
    for name in TASKS:
        task = make_task(Cfg(name, seed=3))
        assert task.name == name and task.seed == 3
        p = task.problem("train", 0)
        assert p.question and task.reward(p, "garbage") == 0.0


def test_options_reach_the_task_config():
    assert make_task(Cfg("knights", options={"min_people": 3, "max_people": 4})).config.max_people == 4
    assert make_task(Cfg("sokoban", options={"boxes": 2, "max_moves": 12})).config.boxes == 2
    assert make_task(Cfg("math", options={"operations": ["add", "mul"]})).config.operations == ("add", "mul")
    assert make_task(Cfg("arith", options={"operations": ["sub"]})).config.operations == ("sub",)


@pytest.mark.parametrize("cfg,match", [
    (Cfg("chess"), "unknown task"),
    (Cfg("knights", options={"people": 3}), "unknown knob"),
    (Cfg("knights", options={"max_people": 12}), "max_people"),
    (Cfg("sokoban", options={"height": 2}), "height"),
])
def test_bad_config_is_a_clear_value_error(cfg, match):
    with pytest.raises(ValueError, match=match):
        make_task(cfg)
