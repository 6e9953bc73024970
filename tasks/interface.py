"""The two task shapes: single-turn tasks and multi-turn environments, and the episode contract.

Single-turn (arith, math, knights, and Sokoban as a one-shot plan): the learner renders the prompt
with ``task.render_prompt(tokenizer, problem)``, a node samples one completion, and the learner
recomputes ``task.reward(problem, completion_text)``. That is :class:`SingleTurnTask`, the protocol
every task meets (the learner and the nodes are typed against it); :class:`Tokenizer` is what
they use of a Hugging Face tokenizer.

Multi-turn (Sokoban): an :class:`EnvTask` also builds an :class:`Environment`. One episode:

1. ``env = task.make_env()``; ``obs = env.reset(problem)``;
   ``turns = task.first_turns(obs)`` (system text + the first observation as a user turn).
2. Repeat at most ``task.max_turns`` times: prompt the model with the conversation so far;
   the model's completion is one assistant turn; ``obs, done = env.step(completion_text)``;
   stop when ``done``, else append ``obs`` as the next user turn.
3. The reward is ``task.episode_reward(problem, assistant_texts)``: the learner parses every
   assistant turn again and replays the actions from the problem's start state, so it trusts
   neither the node's environment nor a reward the node reports.

Token bookkeeping (what the trainer needs): an episode is a list of :class:`Segment` s in order,
``prompt`` (the first chat prompt), then alternating ``model`` (tokens the model sampled, with
their behaviour log-probs) and ``env`` (the tokens the environment appended: end of the
assistant turn if the model did not emit it, the user turn with the observation, and the
generation prompt of the next assistant turn). Model tokens are never re-tokenised: the prompt
of turn k+1 is exactly the concatenation of all earlier segments, so the log-probs the node
reported stay valid. :func:`flatten_segments` gives the token ids and the loss mask (1 only on
model tokens); the trainer must apply the policy loss only where the mask is 1.

:func:`run_episode` is the reference driver of this contract, written against a plain
``generate(prompt_ids) -> (token_ids, logprobs, finish_reason)`` callable, so a node's agent
and the evaluator share it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol, Sequence, TypeGuard, runtime_checkable

from tasks.base import Problem, Split, template_kwargs

Role = Literal["system", "user", "assistant"]
SegmentKind = Literal["prompt", "model", "env"]

_SENTINEL = "\x00ECHO_SWARM_SPLIT\x00"
"""Placeholder assistant content used to cut the chat template's text around a turn."""


class Tokenizer(Protocol):
    """What the tasks and the learner use of a Hugging Face tokenizer."""

    def __call__(self, text: str, add_special_tokens: bool = ...) -> Any: ...

    def apply_chat_template(self, conversation: Any, tokenize: bool = ..., add_generation_prompt: bool = ...,
                            **kwargs: Any) -> Any: ...

    def decode(self, token_ids: Any, skip_special_tokens: bool = ...) -> str: ...


@runtime_checkable
class SingleTurnTask(Protocol):
    """The task protocol: one prompt, one completion, one reward. Every task meets it; a task
    may also score a group at once (:class:`GroupScoredTask`) or run episodes (:class:`EnvTask`)."""

    name: str

    def problem(self, split: Split, index: int) -> Problem:
        """Problem ``index`` of ``split``; deterministic; train and eval never share a question."""

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        """Chat messages that pose ``problem``."""

    def render_prompt(self, tokenizer: Any, problem: Problem) -> list[int]:
        """Prompt token ids (chat template, generation prompt appended)."""

    def reward(self, problem: Problem, completion_text: str) -> float:
        """A finite reward recomputed from the decoded completion alone (``NaN``: none, logged)."""


@runtime_checkable
class GroupScoredTask(Protocol):
    """A task that scores a prompt group's completions together (reward functions in TRL's batch
    form see the whole group): ``NaN`` marks a completion without a valid reward."""

    def score_group(self, problem: Problem, texts: Sequence[str],
                    completion_ids: Sequence[Sequence[int]] | None = None) -> list[float]:
        """One reward per completion of ``texts`` (decoded) / ``completion_ids`` (their tokens)."""


@runtime_checkable
class Environment(Protocol):
    """A deterministic environment for one episode; pure Python, no I/O."""

    def reset(self, problem: Problem) -> str:
        """Start an episode on ``problem``; return the first observation text."""

    def step(self, action_text: str) -> tuple[str, bool]:
        """Apply one assistant turn (its full decoded text); return (next observation, done)."""


@runtime_checkable
class EnvTask(SingleTurnTask, Protocol):
    """A task that can also run as a multi-turn episode (see the module docstring)."""

    max_turns: int

    def make_env(self) -> Environment:
        """A fresh environment (one per episode)."""

    def first_turns(self, observation: str) -> list[tuple[Role, str]]:
        """The conversation before the first model turn, ending with ``observation`` as a user turn."""

    def episode_reward(self, problem: Problem, assistant_texts: Sequence[str]) -> float:
        """The reward of an episode, recomputed by replaying the actions of ``assistant_texts``."""


def is_env_task(task: object) -> TypeGuard[EnvTask]:
    """True when ``task`` offers the multi-turn interface."""
    return all(callable(getattr(task, m, None)) for m in ("make_env", "first_turns", "episode_reward")) \
        and isinstance(getattr(task, "max_turns", None), int)


# -- chat rendering ----------------------------------------------------------------------------

def _messages(turns: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    out = []
    for role, text in turns:
        if role not in ("system", "user", "assistant"):
            raise ValueError(f"unknown chat role {role!r}")
        out.append({"role": role, "content": str(text)})
    return out


def chat_prompt(tokenizer: Any, turns: Sequence[tuple[str, str]]) -> list[int]:
    """Token ids of ``turns`` ((role, text) pairs) rendered with the tokenizer's chat template,
    ending with the generation prompt of the next assistant turn."""
    text = tokenizer.apply_chat_template(_messages(turns), tokenize=False, add_generation_prompt=True,
                                         **template_kwargs(tokenizer))
    return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]


def env_turn_ids(tokenizer: Any, observation: str, model_stop_text: str = "") -> list[int]:
    """Tokens the environment appends after a model turn: the rest of the assistant turn's
    closing, the user turn holding ``observation``, and the next generation prompt.

    ``model_stop_text`` is the decoded end-of-turn token the model itself emitted (e.g.
    ``<|im_end|>``), or ``""`` when the completion was cut by the length limit; a closing
    the model already produced is not repeated.
    """
    msgs = _messages([("system", "s"), ("user", "u"), ("assistant", _SENTINEL), ("user", observation)])
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **template_kwargs(tokenizer))
    if text.count(_SENTINEL) != 1:
        raise ValueError("the chat template does not keep assistant content verbatim")
    after = text.split(_SENTINEL, 1)[1]
    if model_stop_text and after.startswith(model_stop_text):
        after = after[len(model_stop_text):]
    return [int(t) for t in tokenizer(after, add_special_tokens=False)["input_ids"]]


# -- segments ----------------------------------------------------------------------------------

@dataclass
class Segment:
    """A run of tokens of one origin; ``logprobs`` (behaviour) only for ``model`` segments."""

    kind: SegmentKind
    token_ids: list[int]
    logprobs: list[float] = field(default_factory=list)


def flatten_segments(segments: Sequence[Segment]) -> tuple[list[int], list[int]]:
    """All token ids in order and the loss mask (1 on model tokens, 0 on prompt/env tokens)."""
    ids: list[int] = []
    mask: list[int] = []
    for s in segments:
        ids += s.token_ids
        mask += [1 if s.kind == "model" else 0] * len(s.token_ids)
    return ids, mask


@dataclass
class Episode:
    """A finished episode: its segments, the assistant texts, the reward and the turn count."""

    segments: list[Segment]
    assistant_texts: list[str]
    observations: list[str]
    reward: float
    turns: int
    done: bool


GenerateFn = Callable[[list[int]], tuple[list[int], list[float], str]]
"""``generate(prompt_ids) -> (token_ids, logprobs, finish_reason)``; finish reason ``stop``/``length``."""


def run_episode(task: Any, problem: Problem, tokenizer: Any, generate: GenerateFn,
                max_context_tokens: int | None = None) -> Episode:
    """Run one multi-turn episode of ``task`` on ``problem`` (the contract in the module docstring).

    ``max_context_tokens`` ends the episode early when the next prompt would exceed it.
    The reward is recomputed from the assistant texts with ``task.episode_reward``.
    """
    env = task.make_env()
    obs = env.reset(problem)
    prompt = chat_prompt(tokenizer, task.first_turns(obs))
    segments = [Segment("prompt", prompt)]
    context = list(prompt)
    texts: list[str] = []
    observations = [obs]
    done = False
    for _ in range(task.max_turns):
        if max_context_tokens is not None and len(context) >= max_context_tokens:
            break
        ids, logprobs, finish = generate(list(context))
        segments.append(Segment("model", list(ids), list(logprobs)))
        context += ids
        stop_text = ""
        if finish == "stop" and ids:
            stop_text = tokenizer.decode([ids[-1]], skip_special_tokens=False)
            text = tokenizer.decode(ids[:-1], skip_special_tokens=True)
        else:
            text = tokenizer.decode(ids, skip_special_tokens=True)
        texts.append(text)
        obs, done = env.step(text)
        observations.append(obs)
        if done:
            break
        more = env_turn_ids(tokenizer, obs, stop_text)
        segments.append(Segment("env", more))
        context += more
    return Episode(segments, texts, observations, float(task.episode_reward(problem, texts)), len(texts), done)
