"""Tasks from outside the package: ``module:factory`` paths and the ``echo_swarm.tasks`` entry points.

``task.name`` is read by :func:`parse_task_name`, a pure function:

- a built-in name (``arith``, ``math``, ``knights``, ``sokoban``, ``data``);
- ``rg:<dataset>``: a reasoning-gym generator (:mod:`tasks.rg`);
- ``vf:<taskset>``: a verifiers environment (:mod:`tasks.vf_env`);
- ``package.module:factory``: ``factory`` is imported from ``package.module`` (the current
  directory is searched too, after everything installed);
- ``path/to/file.py:factory``: ``factory`` from a Python file (relative to the current
  directory), e.g. ``examples/my_task.py:make``: a task file beside the run, nothing installed;
- any other plain name: an entry point of that name in the group ``echo_swarm.tasks``, as an
  installed package declares it (``[project.entry-points."echo_swarm.tasks"] my_task =
  "my_pkg.tasks:make"``).

A factory is called as ``factory(seed=<task.seed>, **<task.options>)`` and returns an object
meeting :class:`tasks.interface.SingleTurnTask` (and :class:`tasks.interface.EnvTask` for a
multi-turn task). Its optional ``version`` string travels in every multi-turn lease, so a node
runs an environment only with the same plugin at the same version (:func:`check_node_task`).

Nothing executable ever travels over the network: a name is looked up among what is installed
on the machine reading it; a node that lacks it refuses the work (:class:`TaskNotInstalled`).

User code is trusted to load but not to behave: :class:`GuardedTask` turns a reward that
raises, or returns something that is not a finite number, into a logged ``NaN`` (no reward:
the learner keeps that completion out of its group's advantages), so one bad completion never
stops a learner. Any finite value is a reward (GRPO normalises per group). When the task is
built its ``reward`` is called once on the first training problem, so a reward that cannot be
called that way stops the learner before anything heavy starts.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
import os
import re
import sys
import zlib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Literal

log = logging.getLogger("echo_swarm.tasks")

ENTRY_POINT_GROUP = "echo_swarm.tasks"
"""Entry-point group through which installed packages offer tasks."""

BUILTIN_TASKS = ("arith", "math", "knights", "sokoban", "data")
"""Tasks shipped with the package (``tasks/registry.py``)."""

RG_PREFIX = "rg:"
"""``task.name`` prefix of reasoning-gym datasets."""

VF_PREFIX = "vf:"
"""``task.name`` prefix of verifiers environments (:mod:`tasks.vf_env`)."""

REQUIRED_METHODS = ("problem", "render_prompt", "reward")
#: Methods of ``tasks.interface``'s protocols that a guarded task passes through unchanged.
PROTOCOL_METHODS = ("problem", "messages", "render_prompt", "make_env", "first_turns")
"""What every task object must offer (:class:`tasks.interface.SingleTurnTask`)."""

_PATH = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", re.ASCII)
_PLAIN = re.compile(r"[A-Za-z_][\w.-]*", re.ASCII)
_FILE = re.compile(r"([^:]+\.py):([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)", re.ASCII)

Kind = Literal["builtin", "rg", "vf", "path", "file", "entry_point"]


class TaskNotInstalled(ValueError):
    """The named task (plugin module, entry point or reasoning-gym) is not available here."""


@dataclass(frozen=True)
class TaskRef:
    """A parsed ``task.name``: how to find the task and the string that names it there."""

    kind: Kind
    target: str


def parse_task_name(name: Any) -> TaskRef:
    """``task.name`` -> :class:`TaskRef`; ``ValueError`` for a name of no known form."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError("task.name must be a non-empty string")
    name = name.strip()
    if name in BUILTIN_TASKS:
        return TaskRef("builtin", name)
    if name.startswith(RG_PREFIX):
        dataset = name[len(RG_PREFIX):]
        if not re.fullmatch(r"[A-Za-z0-9_]+", dataset, re.ASCII):
            raise ValueError(f"task.name {name!r}: rg:<dataset> needs a reasoning-gym dataset name, e.g. rg:basic_arithmetic")
        return TaskRef("rg", dataset)
    if name.startswith(VF_PREFIX):
        taskset = name[len(VF_PREFIX):]
        if not re.fullmatch(r"([A-Za-z0-9][\w.-]*/)?[A-Za-z_][\w-]*(@[\w.+-]+)?", taskset, re.ASCII):
            raise ValueError(f"task.name {name!r}: vf:<taskset> needs a verifiers taskset id (an installed module "
                             "name, or owner/name), e.g. vf:my_env")
        return TaskRef("vf", taskset)
    if _FILE.fullmatch(name):
        return TaskRef("file", name)
    if ":" in name:
        if not _PATH.fullmatch(name):
            raise ValueError(f"task.name {name!r}: a plugin path is 'package.module:factory'")
        return TaskRef("path", name)
    if _PLAIN.fullmatch(name):
        return TaskRef("entry_point", name)
    raise ValueError(f"unknown task {name!r}; built-in: {', '.join(BUILTIN_TASKS)}; or rg:<dataset>, "
                     f"package.module:factory, or an entry point of group {ENTRY_POINT_GROUP!r}")


def resolve_attr(path: str, what: str = "task factory") -> Callable[..., Any]:
    """The object at ``package.module:attr`` (``attr`` may be dotted). The current directory is
    tried after ``sys.path``; ``TaskNotInstalled`` when the module is not found."""
    module_name, _, attr = path.rpartition(":")
    try:
        module = _load_file(module_name) if _FILE.fullmatch(path) else _import(module_name)
    except ModuleNotFoundError as e:
        raise TaskNotInstalled(f"{what} {path!r}: module {e.name!r} is not installed here (install the package "
                               "that provides it, or run from the directory that holds it)") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{what} {path!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{what} {path!r} is not callable")
    return obj


def _import(module_name: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        top = module_name.split(".")[0]
        cwd = os.getcwd()
        if e.name not in (top, module_name) or cwd in sys.path or "" in sys.path:
            raise
        sys.path.append(cwd)  # after everything installed: a local file never shadows a package
        importlib.invalidate_caches()
        return importlib.import_module(module_name)


def _load_file(file: str):
    """The module of a Python file, loaded once per absolute path (kept in ``sys.modules``)."""
    p = Path(file).expanduser().resolve()
    if not p.is_file():
        raise TaskNotInstalled(f"task file {file!r} not found (relative paths start at {os.getcwd()!r})")
    name = "echo_swarm_user_task_%s_%08x" % (re.sub(r"\W", "_", p.stem), zlib.crc32(str(p).encode()))
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, p)
        if spec is None or spec.loader is None:
            raise TaskNotInstalled(f"task file {file!r} cannot be loaded as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def entry_point_factory(name: str) -> Callable[..., Any]:
    """The factory an installed package declares as ``name`` in group ``echo_swarm.tasks``."""
    found = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        raise TaskNotInstalled(f"unknown task {name!r}: not built in ({', '.join(BUILTIN_TASKS)}), and no installed "
                               f"package declares it in entry-point group {ENTRY_POINT_GROUP!r}; "
                               "for a module of your own use task.name = 'package.module:factory'")
    try:
        obj = found[0].load()
    except ModuleNotFoundError as e:
        raise TaskNotInstalled(f"task {name!r}: its entry point {found[0].value!r} needs module {e.name!r}, "
                               "which is not installed here") from None
    if not callable(obj):
        raise ValueError(f"task {name!r}: entry point {found[0].value!r} is not callable")
    return obj


def build_plugin(ref: TaskRef, seed: int, options: dict[str, Any]) -> Any:
    """Call the plugin's factory with ``seed`` and ``options`` and check what it returns."""
    factory = entry_point_factory(ref.target) if ref.kind == "entry_point" else resolve_attr(ref.target)
    try:
        task = factory(seed=int(seed), **options)
    except TypeError as e:
        raise ValueError(f"task {ref.target!r}: its factory refused seed/options {sorted(options)}: {e}") from None
    missing = [m for m in REQUIRED_METHODS if not callable(getattr(task, m, None))]
    if missing:
        raise ValueError(f"task {ref.target!r}: the factory returned {type(task).__name__}, which lacks "
                         f"{', '.join(missing)} (see tasks/interface.py)")
    check_reward_call(task, ref.target)
    return GuardedTask(task, ref.target)


def check_reward_call(task: Any, label: str) -> None:
    """Call ``task.reward(problem, text)`` once on the first training problem (its answer as
    the completion): a reward that cannot be called so is a ``ValueError`` naming it."""
    try:
        problem = task.problem("train", 0)
        value = task.reward(problem, str(problem.answer))
        float(value)
    except Exception as e:
        raise ValueError(f"task {label!r}: reward(problem, completion_text) failed on the first training problem "
                         f"(its answer as the completion): {type(e).__name__}: {e}; a task's reward takes the "
                         "Problem and the decoded completion text and returns a number (tasks/interface.py)") from None


def task_version(task: Any) -> str:
    """The task's declared ``version`` (``""`` when it declares none)."""
    v = getattr(task, "version", "")
    return str(v) if v is not None else ""


def check_node_task(name: str, wanted_version: str, task: Any) -> None:
    """A node's check before it runs a lease's environment: the task it built from the lease's
    name must be at the version the lease names (``ValueError`` naming both otherwise)."""
    have = task_version(task)
    if wanted_version and have != wanted_version:
        raise ValueError(f"task {name!r}: the learner runs version {wanted_version!r}, this node has "
                         f"{have or 'no version'!r}; install the same version of the plugin on this node")


def safe_score(value: Any, where: str) -> float:
    """``value`` as a reward (any finite number); anything else is ``NaN``, no reward (logged)."""
    try:
        r = float(value)
    except (TypeError, ValueError):
        log.warning("%s returned %r, not a number: no reward", where, type(value).__name__)
        return math.nan
    if not math.isfinite(r):
        log.warning("%s returned %r: no reward", where, r)
        return math.nan
    return r


class GuardedTask:
    """A plugin's task with its rewards guarded (module docstring); every other attribute is
    the plugin's own."""

    def __init__(self, inner: Any, label: str) -> None:
        self._inner = inner
        self._label = label
        # the interface's methods the plugin has, as this object's own attributes: from Python 3.12
        # isinstance() against a runtime-checkable Protocol looks attributes up statically and no
        # longer sees those that __getattr__ hands out
        for method in PROTOCOL_METHODS:
            if callable(getattr(inner, method, None)):
                setattr(self, method, getattr(inner, method))

    def __getattr__(self, item: str) -> Any:
        return getattr(self._inner, item)

    @property
    def name(self) -> str:
        return str(getattr(self._inner, "name", self._label))

    def reward(self, problem: Any, completion_text: str) -> float:
        try:
            value = self._inner.reward(problem, completion_text)
        except Exception as e:  # user code: log it, never stop the learner
            log.warning("task %s: reward raised %r on problem %s: no reward", self._label, e, getattr(problem, "id", "?"))
            return math.nan
        return safe_score(value, f"task {self._label}: reward")

    def episode_reward(self, problem: Any, assistant_texts: Any) -> float:
        fn = getattr(self._inner, "episode_reward")
        try:
            value = fn(problem, assistant_texts)
        except Exception as e:
            log.warning("task %s: episode_reward raised %r: no reward", self._label, e)
            return math.nan
        return safe_score(value, f"task {self._label}: episode_reward")
