"""Tasks by name, built from the learner's ``[task]`` config section."""

from __future__ import annotations

import dataclasses
from typing import Any

TASKS = ("arith",)


def make_task(cfg: Any):
    """Build the task named ``cfg.name`` with seed ``cfg.seed`` and knobs ``cfg.options``."""
    options = dict(getattr(cfg, "options", {}) or {})
    if cfg.name == "arith":
        from tasks.arith import ArithConfig, ArithTask

        known = {f.name for f in dataclasses.fields(ArithConfig)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"task.options: unknown knob(s) {unknown} for arith; known: {sorted(known)}")
        if "operations" in options:
            options["operations"] = tuple(options["operations"])
        return ArithTask(ArithConfig(**options), seed=cfg.seed)
    raise ValueError(f"unknown task {cfg.name!r}; available: {', '.join(TASKS)}")
