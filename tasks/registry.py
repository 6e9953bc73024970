"""Tasks by name, built from the learner's ``[task]`` config section.

``task.name`` picks the task; ``task.options`` holds the knobs of its config dataclass (the
fields documented in ``tasks/<name>.py``); unknown knobs are an error naming the known ones.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

TASKS = ("arith", "math", "knights", "sokoban")


def _classes(name: str) -> tuple[type, type]:
    """(task class, config class) of ``name``; imported late (cheap modules, but only what is used)."""
    if name == "arith":
        from tasks.arith import ArithConfig, ArithTask
        return ArithTask, ArithConfig
    if name == "math":
        from tasks.math_jsonl import MathConfig, MathTask
        return MathTask, MathConfig
    if name == "knights":
        from tasks.knights import KnightsConfig, KnightsTask
        return KnightsTask, KnightsConfig
    if name == "sokoban":
        from tasks.sokoban import SokobanConfig, SokobanTask
        return SokobanTask, SokobanConfig
    raise ValueError(f"unknown task {name!r}; available: {', '.join(TASKS)}")


def build_config(name: str, options: dict[str, Any]) -> Any:
    """The config dataclass of task ``name`` from ``options`` (lists become tuples)."""
    _, config_cls = _classes(name)
    known = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"task.options: unknown knob(s) {unknown} for {name}; known: {sorted(known)}")
    opts = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}
    try:
        return config_cls(**opts)
    except TypeError as e:
        raise ValueError(f"task.options for {name}: {e}") from None


def make_task(cfg: Any):
    """Build the task named ``cfg.name`` with seed ``cfg.seed`` and knobs ``cfg.options``."""
    options = dict(getattr(cfg, "options", {}) or {})
    task_cls: Callable = _classes(cfg.name)[0]
    return task_cls(build_config(cfg.name, options), seed=cfg.seed)
