"""Rewards and advantages of completed groups: the learner recomputes every reward from the
tokens with the run's task (a node's reward is never trusted) and turns each group's rewards
into GRPO advantages (:func:`learner.grpo.group_advantages`; ``train.scale_rewards``: divided by
the group's std, GRPO's own rule, or only mean-centred, Dr. GRPO's).

- single-turn: the completion's text is decoded and scored by ``task.reward``, or the whole
  group at once by ``task.score_group`` (:class:`tasks.interface.GroupScoredTask`: reward
  functions in TRL's batch form);
- multi-turn episodes (a group whose completions carry a loss mask): each episode is replayed
  (``tasks.episode_tokens.replay_record``), the model's turns are cut out of the record and
  ``task.episode_reward`` scores them; the environment's tokens get no loss. An episode that
  does not replay scores 0 (the coordinator's verifier already refuses such groups).

A reward may be any finite number; ``NaN`` means the completion has no valid reward (its reward
function failed: logged where it happened). Such a completion is kept out of its group's
normalisation and gets advantage 0 (no gradient); the step's row counts it in ``reward_errors``.
"""

from __future__ import annotations

import logging
import math
from learner.batching import TrainSample
from learner.coordinator import CompletedGroup
from learner.grpo import group_advantages
from tasks.episode_tokens import replay_record
from tasks.interface import EnvTask, GroupScoredTask, SingleTurnTask, Tokenizer, is_env_task

log = logging.getLogger("echo_swarm.learner")


def rewards_and_advantages(groups: list[CompletedGroup], task: SingleTurnTask, tokenizer: Tokenizer,
                           scale_by_std: bool = True) -> tuple[list[TrainSample], list[float]]:
    """Rewards recomputed from the tokens -> per-completion samples with GRPO advantages
    (``scale_by_std``: divided by the group's reward std; False: mean-centred only)."""
    samples: list[TrainSample] = []
    all_rewards: list[float] = []
    for g in groups:
        if any(c.mask for c in g.result.completions):  # an episode: only an environment task made it
            if not is_env_task(task):
                raise ValueError(f"group {g.spec.group_id} is an episode, but the task has no environment")
            more, rewards = episode_group_samples(g, task, tokenizer, scale_by_std)
        else:
            more, rewards = group_samples(g, task, tokenizer, scale_by_std)
        samples += more
        all_rewards += rewards
    return samples, all_rewards


def finite_advantages(rewards: list[float], scale_by_std: bool = True) -> list[float]:
    """GRPO advantages of a group over its finite rewards; 0.0 for a ``NaN`` (no reward)."""
    ok = [j for j, r in enumerate(rewards) if math.isfinite(r)]
    adv = [0.0] * len(rewards)
    for j, a in zip(ok, group_advantages([rewards[j] for j in ok], scale_by_std=scale_by_std).tolist()):
        adv[j] = float(a)
    return adv


def reward_fields(rewards: list[float]) -> dict[str, float | int]:
    """A step row's reward figures: the mean of the finite rewards and how many had none."""
    finite = [r for r in rewards if math.isfinite(r)]
    return {"reward_mean": sum(finite) / len(finite) if finite else 0.0, "reward_errors": len(rewards) - len(finite)}


def group_samples(group: CompletedGroup, task: SingleTurnTask, tokenizer: Tokenizer,
                  scale_by_std: bool = True) -> tuple[list[TrainSample], list[float]]:
    """(training samples, rewards) of one completed single-turn group."""
    problem = task.problem("train", int(group.spec.problem_ref))
    ids = [list(c.token_ids) for c in group.result.completions]
    texts = [tokenizer.decode(i, skip_special_tokens=True) for i in ids]
    if isinstance(task, GroupScoredTask):
        rewards = [float(r) for r in task.score_group(problem, texts, ids)]
    else:
        rewards = [float(task.reward(problem, t)) for t in texts]
    adv = finite_advantages(rewards, scale_by_std)
    samples = [TrainSample(group.spec.prompt_ids, c.token_ids, c.logprobs, float(a), group_id=group.spec.group_id)
               for c, a in zip(group.result.completions, adv)]
    return samples, rewards


def episode_group_samples(group: CompletedGroup, task: EnvTask, tokenizer: Tokenizer,
                          scale_by_std: bool = True) -> tuple[list[TrainSample], list[float]]:
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
    adv = finite_advantages(rewards, scale_by_std)
    samples = [TrainSample(group.spec.prompt_ids, c.token_ids, c.logprobs, float(a), loss_mask=list(c.mask),
                           group_id=group.spec.group_id)
               for c, a in zip(group.result.completions, adv)]
    return samples, rewards
