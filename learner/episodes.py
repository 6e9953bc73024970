"""The learner's side of multi-turn episodes (``task.multi_turn = true``).

- :func:`run_task` builds the run's task (``task.max_turns`` merged into its options) and
  refuses ``multi_turn`` for a task without an environment.
- :class:`EpisodeSettings` is what every multi-turn lease carries (task name, seed, options,
  turn and token limits) and the coordinator's limits for episodes.
- :func:`make_verifier` is the coordinator's check of an arriving group: every episode is
  replayed (``tasks.episode_tokens.replay_record``) and its environment turns must be exactly
  the tokens this side computes; a group with one bad episode is rejected and re-issued.
- :func:`learner.scoring.episode_group_samples` recomputes the rewards: the model's turns are cut out of the
  record by the mask, the environment replays their actions from the problem's start, and the
  task's documented shaping gives the reward (``task.episode_reward``); nothing the node
  computed is trusted. Each episode becomes one training sample whose loss mask covers the
  model's tokens only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

from learner.config import LearnerConfig, TaskConfig
from tasks.base import Problem
from tasks.episode_tokens import episode_prompt, replay_record
from tasks.interface import SingleTurnTask, Tokenizer, is_env_task
from tasks.plugins import task_version

log = logging.getLogger("echo_swarm.learner")

#: Token allowance per turn for the environment's observation in the default episode budget.
ENV_TURN_TOKENS = 128


def task_options(task_cfg: TaskConfig) -> dict[str, Any]:
    """The task's options with ``task.max_turns`` merged in (multi-turn runs only; the config's
    rules keep the two from contradicting each other)."""
    options = dict(task_cfg.options)
    if task_cfg.max_turns:
        options["max_turns"] = task_cfg.max_turns
    return options


def run_task(task_cfg: TaskConfig) -> SingleTurnTask:
    """The run's task; ``ValueError`` (a config error) for ``multi_turn`` on a task without an
    environment."""
    from tasks.registry import make_task

    task = make_task(SimpleNamespace(name=task_cfg.name, seed=task_cfg.seed, options=task_options(task_cfg)))
    if task_cfg.multi_turn and not is_env_task(task):
        raise ValueError(f"task.multi_turn = true needs a task with an environment; {task_cfg.name!r} has none "
                         "(multi-turn tasks: sokoban)")
    return task


@dataclass
class EpisodeSettings:
    """What a multi-turn lease tells a node, and the coordinator's limits for episodes."""

    task: str
    seed: int
    options: dict[str, Any] = field(default_factory=dict)
    max_turns: int = 1
    max_episode_tokens: int = 1
    version: str = ""
    """The task's declared version (``tasks.plugins.task_version``): a node must run the same."""

    def lease_fields(self) -> dict[str, Any]:
        """Keyword arguments of ``swarm.proto.work.Lease``."""
        return dict(episode=self.task, task_seed=self.seed, task_options=dict(self.options),
                    max_turns=self.max_turns, max_episode_tokens=self.max_episode_tokens, task_version=self.version)

    def limits(self) -> dict[str, int]:
        """Keyword arguments of ``learner.coordinator.Limits``."""
        return dict(max_turns=self.max_turns, max_episode_tokens=self.max_episode_tokens)


def episode_settings(cfg: LearnerConfig, task: SingleTurnTask) -> EpisodeSettings | None:
    """The run's episode settings, or ``None`` for a single-turn run."""
    if not cfg.task.multi_turn:
        return None
    turns = task.max_turns if is_env_task(task) else 1
    budget = cfg.task.max_episode_tokens or turns * (cfg.train.max_tokens + ENV_TURN_TOKENS)
    return EpisodeSettings(cfg.task.name, cfg.task.seed, task_options(cfg.task), turns, budget, task_version(task))


def initial_prompt(task: SingleTurnTask, tokenizer: Tokenizer, problem: Problem, multi_turn: bool) -> list[int]:
    """The prompt of a group: the single-turn prompt, or the episode's first turn."""
    if multi_turn and is_env_task(task):
        return episode_prompt(task, tokenizer, problem)
    return task.render_prompt(tokenizer, problem)


def make_verifier(task: SingleTurnTask, tokenizer: Tokenizer) -> Callable[[Any, Any], str | None]:
    """``verify(spec, result) -> reason or None`` for ``Coordinator.verify``: replays every
    episode of the group (runs after the coordinator's structural checks)."""
    def verify(spec, result) -> str | None:
        try:
            problem = task.problem("train", int(spec.problem_ref))
            for j, c in enumerate(result.completions):
                error = replay_record(task, problem, tokenizer, c.token_ids, c.mask).error
                if error is not None:
                    return f"episode_replay: episode {j}: {error}"
        except Exception as e:  # a record this side cannot even decode is the sender's fault
            log.warning("episode replay of %s failed: %r", spec.group_id, e)
            return f"episode_replay: {type(e).__name__}: {e}"
        return None
    return verify
