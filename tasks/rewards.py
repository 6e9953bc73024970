"""Reward functions as the ecosystem writes them: TRL's batch form and verifiers' keyword form.

A reward is named ``package.module:function`` or ``path/to/file.py:function`` (several may be
given, each with a weight). Its form is read from its signature (:func:`reward_form`, pure):

- **batch** (TRL's ``GRPOTrainer`` convention): the function names ``completions``, ``prompts``
  or ``completion_ids``. It is called once per prompt group as
  ``f(prompts=[...], completions=[...], completion_ids=[...], <column>=[...], trainer_state=None,
  log_extra=..., log_metric=...)`` with one list entry per completion, and returns a list of
  the same length (``None`` in it: this function has no opinion on that completion, as in TRL).
- **keyword** (verifiers' rubric convention): the parameters are injected by name from
  ``prompt``, ``completion``, ``answer``, ``state``, ``info``, ``task``, ``completion_ids`` and
  the dataset's columns; it is called once per completion and returns a number (or ``None``).

Either form may be ``async``. Prompts and completions are strings when the dataset's prompt is
a string, and chat messages (``[{"role": ..., "content": ...}]``) when it is a list of messages,
as TRL and verifiers both do.

A completion's reward is the weighted sum of the functions that scored it. Any finite value is
allowed (GRPO normalises per group). A function that raises, returns a non-number, NaN or
infinity, or the wrong number of values gives that completion no reward at all: ``NaN``, logged
with the function's name; the learner keeps such a completion out of its group's advantages
(:mod:`learner.scoring`). :meth:`RewardSet.validate` calls every function once on a real
example before anything heavy starts, so a wrong signature stops the run with a message naming
the function and the forms it may take.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

log = logging.getLogger("echo_swarm.tasks")

Form = Literal["batch", "keyword"]

BATCH_NAMES = ("prompts", "completions", "completion_ids")
"""Parameters that mark TRL's batch form."""
BATCH_EXTRAS = ("trainer_state", "log_extra", "log_metric")
"""Further keyword arguments TRL passes to a batch reward (``trainer_state`` is ``None`` here)."""
KEYWORD_NAMES = ("prompt", "completion", "answer", "state", "info", "task", "completion_ids")
"""Parameters a keyword reward may name (besides the dataset's columns)."""

EXPECTED_FORMS = (
    "a reward is either TRL's batch form, f(completions, **kwargs) -> list[float] (also given prompts=, "
    "completion_ids= and every dataset column as lists, one entry per completion), or verifiers' keyword "
    "form, f(completion, answer, ...) -> float with its parameters injected by name from prompt, "
    "completion, answer, state, info, task, completion_ids and the dataset's columns")


class RewardSignatureError(ValueError):
    """A reward function that cannot be called in either form, or that failed its validation call."""


@dataclass(frozen=True)
class Signature:
    """What :func:`reward_form` reads from a function's signature."""

    form: Form
    names: frozenset[str]
    """Parameters it names (keyword-passable)."""
    required: frozenset[str]
    """Parameters without a default."""
    var_keyword: bool
    """Whether it takes ``**kwargs`` (then it is given everything)."""


def reward_form(fn: Callable[..., Any], label: str) -> Signature:
    """The form of reward ``fn`` from its signature (module docstring); ``RewardSignatureError``
    for one that cannot be called by keyword (positional-only parameters, no signature)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError) as e:
        raise RewardSignatureError(f"reward {label!r}: no readable signature ({e}); {EXPECTED_FORMS}") from None
    positional_only = [p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_ONLY]
    if positional_only:
        raise RewardSignatureError(f"reward {label!r}: positional-only parameter(s) {positional_only} cannot be "
                                   f"passed by name; {EXPECTED_FORMS}")
    named = [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    names = frozenset(p.name for p in named)
    required = frozenset(p.name for p in named if p.default is inspect.Parameter.empty)
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    form: Form = "batch" if names & set(BATCH_NAMES) else "keyword"
    return Signature(form, names, required, var_kw)


def check_signature(sig: Signature, columns: Sequence[str], label: str) -> None:
    """``RewardSignatureError`` when a required parameter is one this form never supplies."""
    offered = set(columns) | (set(BATCH_NAMES) | set(BATCH_EXTRAS) if sig.form == "batch" else set(KEYWORD_NAMES))
    missing = sorted(sig.required - offered)
    if missing:
        raise RewardSignatureError(
            f"reward {label!r} ({sig.form} form) requires parameter(s) {missing}, which are neither "
            f"{'TRL arguments' if sig.form == 'batch' else 'injected names'} nor dataset columns "
            f"(columns: {sorted(columns)}); {EXPECTED_FORMS}")


@dataclass(frozen=True)
class Example:
    """One prompt group as the rewards see it."""

    prompt: Any
    """The prompt: text, or chat messages for a conversational dataset."""
    answer: Any
    row: dict[str, Any]
    """The dataset row (every column), as read."""
    conversational: bool = False


@dataclass(frozen=True)
class RewardFn:
    """One configured reward function."""

    label: str
    fn: Callable[..., Any]
    weight: float
    sig: Signature


def _call(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    out = fn(**kwargs)
    if inspect.isawaitable(out):
        async def wait() -> Any:
            return await out
        out = asyncio.run(wait())
    return out


def _value(value: Any) -> float | None:
    """A reward value as a finite float, ``None`` for an abstention; ``ValueError`` otherwise."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        raise ValueError(f"returned {type(value).__name__} {value[:40]!r}, not a number")
    try:
        r = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"returned {type(value).__name__}, not a number") from None
    if not math.isfinite(r):
        raise ValueError(f"returned {r}")
    return r


def _checked(value: Any) -> float | None | Exception:
    try:
        return _value(value)
    except ValueError as e:
        return e


class RewardSet:
    """Weighted reward functions scored over prompt groups (module docstring)."""

    def __init__(self, fns: Sequence[RewardFn], columns: Sequence[str]) -> None:
        if not fns:
            raise ValueError("at least one reward function is needed")
        self.fns = tuple(fns)
        self.columns = tuple(columns)
        for f in self.fns:
            check_signature(f.sig, self.columns, f.label)

    def _batch_kwargs(self, f: RewardFn, ex: Example, completions: list[Any], ids: list[list[int]]) -> dict[str, Any]:
        n = len(completions)
        kw: dict[str, Any] = {c: [ex.row.get(c)] * n for c in self.columns}
        kw.update(prompts=[ex.prompt] * n, completions=completions, completion_ids=ids, trainer_state=None,
                  log_extra=lambda column, values: None,
                  log_metric=lambda name, value: log.debug("reward %s: %s = %r", f.label, name, value))
        return kw if f.sig.var_keyword else {k: v for k, v in kw.items() if k in f.sig.names}

    def _keyword_kwargs(self, f: RewardFn, ex: Example, completion: Any, ids: list[int]) -> dict[str, Any]:
        kw: dict[str, Any] = {c: ex.row.get(c) for c in self.columns}
        info = ex.row.get("info") if isinstance(ex.row.get("info"), dict) else {}
        kw.update(prompt=ex.prompt, completion=completion, answer=ex.answer, info=info,
                  task=ex.row.get("task", "default"), completion_ids=ids,
                  state={"prompt": ex.prompt, "completion": completion, "answer": ex.answer, "info": info,
                         "completion_ids": ids})
        return kw if f.sig.var_keyword else {k: v for k, v in kw.items() if k in f.sig.names}

    def _scores_of(self, f: RewardFn, ex: Example, completions: list[Any],
                   ids: list[list[int]]) -> list[float | None | Exception]:
        """One function's value (or error) for every completion; raises when a batch call fails whole."""
        if f.sig.form == "batch":
            out = _call(f.fn, self._batch_kwargs(f, ex, completions, ids))
            if isinstance(out, (str, bytes, dict)) or not hasattr(out, "__len__"):
                raise ValueError(f"returned {type(out).__name__}, not a list of {len(completions)} values")
            out = list(out)
            if len(out) != len(completions):
                raise ValueError(f"returned {len(out)} values for {len(completions)} completions")
            return [_checked(v) for v in out]
        values: list[float | None | Exception] = []
        for c, i in zip(completions, ids):
            try:
                values.append(_checked(_call(f.fn, self._keyword_kwargs(f, ex, c, i))))
            except Exception as e:  # user code: this completion gets no reward from it
                values.append(e)
        return values

    def score(self, ex: Example, texts: Sequence[str], ids: Sequence[Sequence[int]] | None = None,
              where: str = "") -> list[float]:
        """The weighted reward of each completion; ``NaN`` (logged) for one that has none."""
        completions = [[{"role": "assistant", "content": t}] if ex.conversational else t for t in texts]
        id_lists = [list(i) for i in ids] if ids is not None else [[] for _ in texts]
        at = f" on {where}" if where else ""
        totals: list[float] = [0.0] * len(texts)
        scored = [False] * len(texts)
        bad = [False] * len(texts)
        for f in self.fns:
            try:
                values = self._scores_of(f, ex, completions, id_lists)
            except Exception as e:  # user code: this function gives these completions no reward
                log.warning("reward %s failed%s: %s: %s; %d completion(s) get no reward", f.label, at,
                            type(e).__name__, e, len(texts))
                bad = [True] * len(texts)
                continue
            for j, v in enumerate(values):
                if isinstance(v, Exception):
                    log.warning("reward %s%s, completion %d: %s: %s; it gets no reward", f.label, at, j,
                                type(v).__name__, v)
                    bad[j] = True
                elif v is not None:
                    totals[j] += f.weight * v
                    scored[j] = True
        out = []
        for j in range(len(texts)):
            if not bad[j] and not scored[j]:
                log.warning("no reward function scored completion %d%s (all returned None): it gets no reward", j, at)
            out.append(totals[j] if scored[j] and not bad[j] else math.nan)
        return out

    def validate(self, ex: Example, completion_text: str) -> None:
        """Call every function once on ``ex`` with ``completion_text``; ``RewardSignatureError``
        naming the function, what went wrong and the expected forms when one fails."""
        completions = [[{"role": "assistant", "content": completion_text}] if ex.conversational else completion_text]
        for f in self.fns:
            try:
                (value,) = self._scores_of(f, ex, completions, [[]])
            except Exception as e:
                value = e
            if isinstance(value, Exception):
                raise RewardSignatureError(f"reward {f.label!r} ({f.sig.form} form) failed on the first training "
                                           f"example: {type(value).__name__}: {value}; {EXPECTED_FORMS}")
            log.info("reward %s (%s form, weight %g) scored the first example %s", f.label, f.sig.form, f.weight, value)


def parse_reward_specs(reward: Any, weights: Any) -> list[tuple[str, float]]:
    """``task.options.reward`` (one name or a list) and ``reward_weights`` -> (name, weight) pairs."""
    names = [reward] if isinstance(reward, str) else list(reward) if isinstance(reward, (list, tuple)) else None
    if not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise ValueError("task.options.reward must be a reward name or a non-empty list of them")
    if weights is None or (isinstance(weights, (list, tuple)) and len(weights) == 0):
        ws = [1.0] * len(names)
    elif isinstance(weights, (list, tuple)) and len(weights) == len(names):
        ws = []
        for w in weights:
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(float(w)):
                raise ValueError(f"task.options.reward_weights: {w!r} is not a finite number")
            ws.append(float(w))
    else:
        raise ValueError(f"task.options.reward_weights must list one number per reward ({len(names)})")
    return [(n.strip(), w) for n, w in zip(names, ws)]


def load_reward(name: str, weight: float) -> RewardFn:
    """The reward function ``name`` (``package.module:function`` or ``file.py:function``)."""
    from tasks.plugins import resolve_attr

    fn = resolve_attr(name, "reward")
    return RewardFn(name, fn, weight, reward_form(fn, name))
