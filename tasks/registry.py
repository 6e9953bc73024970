"""Tasks by name, built from the learner's ``[task]`` config section.

``task.name`` picks the task (the forms are listed in :mod:`tasks.plugins`): a built-in, whose
``task.options`` are the knobs of its config dataclass (the fields documented in
``tasks/<name>.py``; unknown knobs are an error naming the known ones); ``rg:<dataset>``
(:mod:`tasks.rg`); ``vf:<taskset>``, a verifiers environment (:mod:`tasks.vf_env`); ``data``, prompts and answers from a local file (:mod:`tasks.data_files`);
or a plugin (``package.module:factory``, ``path/to/file.py:factory`` or an ``echo_swarm.tasks``
entry point), whose factory
gets ``task.options`` as keyword arguments.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from tasks.plugins import build_plugin, parse_task_name

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
    return build_config_of(name, _classes(name)[1], options)


def build_config_of(name: str, config_cls: type, options: dict[str, Any]) -> Any:
    """``config_cls`` from ``options``: unknown knobs and bad values are ``ValueError`` s naming them."""
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
    ref = parse_task_name(cfg.name)
    if ref.kind == "rg":
        from tasks.rg import RGTask

        return RGTask(ref.target, options, seed=cfg.seed)
    if ref.kind == "vf":
        from tasks.vf_env import make_vf_task

        return make_vf_task(ref.target, options, seed=cfg.seed)
    if ref.kind == "builtin" and ref.target == "data":
        from tasks.data_files import DataConfig, DataTask

        return DataTask(build_config_of("data", DataConfig, options), seed=cfg.seed)
    if ref.kind in ("path", "file", "entry_point"):
        return build_plugin(ref, int(cfg.seed), options)
    task_cls: Callable = _classes(cfg.name)[0]
    return task_cls(build_config(cfg.name, options), seed=cfg.seed)
