"""Task plugins: names, loading by path and by entry point, guarded rewards, clear errors."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pytest

from tasks import plugins
from tasks.base import Problem
from tasks.plugins import (TaskNotInstalled, TaskRef, check_node_task, parse_task_name, safe_score,
                           task_version)
from tasks.registry import make_task


@dataclass
class Cfg:
    name: str
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)


PLUGIN = '''
from tasks.base import Problem

class Echo:
    name = "echo"
    version = "1.2"
    def __init__(self, seed, word):
        self.seed, self.word = seed, word
    def problem(self, split, index):
        return Problem(id=f"{split}-{index}", question=f"Say {self.word}", answer=self.word)
    def messages(self, problem):
        return [{"role": "user", "content": problem.question}]
    def render_prompt(self, tokenizer, problem):
        return [1, 2, 3]
    def reward(self, problem, text):
        if text == "boom":
            raise RuntimeError("user bug")
        if text == "nan":
            return float("nan")
        if text == "big":
            return 7
        return 1.0 if problem.answer in text else 0.0

def make(seed=0, word="hi"):
    return Echo(seed, word)

def broken(seed=0):
    return object()
'''


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    (tmp_path / "my_echo_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_echo_plugin"
    sys.modules.pop("my_echo_plugin", None)


@pytest.mark.parametrize("name,ref", [
    ("arith", TaskRef("builtin", "arith")),
    ("data", TaskRef("builtin", "data")),
    ("rg:knights_knaves", TaskRef("rg", "knights_knaves")),
    ("pkg.mod:make", TaskRef("path", "pkg.mod:make")),
    ("pkg.mod:Cls.build", TaskRef("path", "pkg.mod:Cls.build")),
    ("my-task", TaskRef("entry_point", "my-task")),
    ("examples/my_task.py:make", TaskRef("file", "examples/my_task.py:make")),
    ("/abs/dir/t.py:Cls.make", TaskRef("file", "/abs/dir/t.py:Cls.make")),
])
def test_parse_task_name(name, ref):
    assert parse_task_name(name) == ref


@pytest.mark.parametrize("name", ["", "rg:", "rg:a b", "a:b:c", "pkg.mod:", ":make", "a b", 3])
def test_bad_names_are_value_errors(name):
    with pytest.raises(ValueError):
        parse_task_name(name)


def test_path_plugin_builds_with_seed_and_options(plugin_module):
    task = make_task(Cfg(f"{plugin_module}:make", seed=5, options={"word": "yes"}))
    assert task.seed == 5 and task.word == "yes" and task.name == "echo" and task_version(task) == "1.2"
    p = task.problem("train", 0)
    assert task.reward(p, "yes!") == 1.0 and task.reward(p, "no") == 0.0


def test_guarded_rewards_never_raise(plugin_module, caplog):
    task = make_task(Cfg(f"{plugin_module}:make"))
    p = task.problem("train", 0)
    assert math.isnan(task.reward(p, "boom")) and "user bug" in caplog.text  # no reward, logged
    assert math.isnan(task.reward(p, "nan")) and task.reward(p, "big") == 7.0  # any finite value, no clamp


def test_plugin_errors_are_clear(plugin_module):
    with pytest.raises(ValueError, match="lacks problem, render_prompt, reward"):
        make_task(Cfg(f"{plugin_module}:broken"))
    with pytest.raises(ValueError, match="refused seed/options"):
        make_task(Cfg(f"{plugin_module}:make", options={"colour": 1}))
    with pytest.raises(ValueError, match="no attribute 'nope'"):
        make_task(Cfg(f"{plugin_module}:nope"))
    with pytest.raises(TaskNotInstalled, match="not installed here"):
        make_task(Cfg("no_such_module_xyz.tasks:make"))
    with pytest.raises(TaskNotInstalled, match="entry-point group 'echo_swarm.tasks'"):
        make_task(Cfg("no-such-task"))


def test_entry_point_plugin(plugin_module, monkeypatch):
    ep = metadata.EntryPoint(name="echo-ep", value=f"{plugin_module}:make", group=plugins.ENTRY_POINT_GROUP)
    real = metadata.entry_points

    def fake(**kw):
        return [ep] if kw.get("group") == plugins.ENTRY_POINT_GROUP else real(**kw)

    monkeypatch.setattr(plugins.metadata, "entry_points", fake)
    task = make_task(Cfg("echo-ep", options={"word": "ok"}))
    assert task.word == "ok" and task.reward(task.problem("eval", 1), "ok") == 1.0


def test_a_module_in_the_current_directory_is_found(tmp_path, monkeypatch):
    (tmp_path / "cwd_only_plugin.py").write_text(PLUGIN)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        assert make_task(Cfg("cwd_only_plugin:make")).word == "hi"
    finally:
        sys.modules.pop("cwd_only_plugin", None)


def test_node_version_check():
    class T:
        version = "2"
    check_node_task("x", "", T())
    check_node_task("x", "2", T())
    with pytest.raises(ValueError, match="learner runs version '3'.*this node has '2'"):
        check_node_task("x", "3", T())
    with pytest.raises(ValueError, match="no version"):
        check_node_task("x", "3", object())


@pytest.mark.parametrize("value,want", [(0.5, 0.5), (True, 1.0), (-1, -1.0), (2, 2.0), ("x", None), (None, None),
                                        (float("inf"), None), (float("nan"), None)])
def test_safe_score(value, want):
    got = safe_score(value, "t")
    assert math.isnan(got) if want is None else got == want


def test_problem_type_is_shared():
    assert Problem("a", "q", 1).answer == 1


def test_a_task_file_is_loaded_by_path(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "file_task.py").write_text(PLUGIN)
    monkeypatch.chdir(tmp_path)
    a = make_task(Cfg("sub/file_task.py:make", options={"word": "w"}))
    b = make_task(Cfg(str(tmp_path / "sub" / "file_task.py") + ":make"))
    assert a.word == "w" and b.word == "hi" and type(a._inner) is type(b._inner)  # loaded once
    with pytest.raises(TaskNotInstalled, match="task file 'sub/none.py' not found"):
        make_task(Cfg("sub/none.py:make"))
