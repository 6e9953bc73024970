"""Rewards and advantages of completed groups: the learner recomputes every reward from the
tokens with the run's task (a node's reward is never trusted) and turns each group's rewards
into GRPO advantages (:func:`learner.grpo.group_advantages`).

- single-turn: the completion's text is decoded and scored by ``task.reward``;
- multi-turn episodes (a group whose completions carry a loss mask): each episode is replayed
  (``tasks.episode_tokens.replay_record``), the model's turns are cut out of the record and
  ``task.episode_reward`` scores them; the environment's tokens get no loss. An episode that
  does not replay scores 0 (the coordinator's verifier already refuses such groups).
"""

from __future__ import annotations

import logging
from typing import Protocol

from learner.batching import TrainSample
from learner.coordinator import CompletedGroup
from learner.grpo import group_advantages
from tasks.episode_tokens import replay_record
from tasks.interface import EnvTask, SingleTurnTask, is_env_task

log = logging.getLogger("echo_swarm.learner")


class Decoder(Protocol):
    """What scoring asks of the tokenizer (a Hugging Face tokenizer is one)."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


def score_groups(groups: list[CompletedGroup], task: SingleTurnTask,
                 tokenizer: Decoder) -> tuple[list[TrainSample], list[float]]:
    """Rewards recomputed from the tokens -> per-completion samples with GRPO advantages."""
    samples: list[TrainSample] = []
    all_rewards: list[float] = []
    for g in groups:
        if any(c.mask for c in g.result.completions):  # an episode: only an environment task made it
            if not is_env_task(task):
                raise ValueError(f"group {g.spec.group_id} is an episode, but the task has no environment")
            more, rewards = score_episode_group(g, task, tokenizer)
        else:
            more, rewards = score_group(g, task, tokenizer)
        samples += more
        all_rewards += rewards
    return samples, all_rewards


def score_group(group: CompletedGroup, task: SingleTurnTask, tokenizer: Decoder) -> tuple[list[TrainSample], list[float]]:
    """(training samples, rewards) of one completed single-turn group."""
    problem = task.problem("train", int(group.spec.problem_ref))
    texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in group.result.completions]
    rewards = [float(task.reward(problem, t)) for t in texts]
    adv = group_advantages(rewards).tolist()
    samples = [TrainSample(group.spec.prompt_ids, c.token_ids, c.logprobs, float(a), group_id=group.spec.group_id)
               for c, a in zip(group.result.completions, adv)]
    return samples, rewards


def score_episode_group(group: CompletedGroup, task: EnvTask, tokenizer: Decoder) -> tuple[list[TrainSample], list[float]]:
    """(training samples, rewards) of one completed multi-turn group."""
    problem = task.problem("train", int(group.spec.problem_ref))
    rewards: list[float] = []
    for c in group.result.completions:
        replay = replay_record(task, problem, tokenizer, c.token_ids, c.mask)
        if replay.error is not None:  # the coordinator's verifier refuses these; never trust one
            log.warning("group %s: episode scored 0: %s", group.spec.group_id, replay.error)
            rewards.append(0.0)
        else:
            rewards.append(float(task.episode_reward(problem, replay.texts)))
    adv = group_advantages(rewards).tolist()
    samples = [TrainSample(group.spec.prompt_ids, c.token_ids, c.logprobs, float(a), loss_mask=list(c.mask),
                           group_id=group.spec.group_id)
               for c, a in zip(group.result.completions, adv)]
    return samples, rewards
