"""Multi-turn episodes on a node: a lease whose ``episode`` names a task runs each group as
``group_size`` episodes of that task's environment with the node's backend.

One group, all under the adapter version the lease names (it is installed before the group
and never changes inside it):

1. the node rebuilds the task (``tasks.registry.make_task`` with the lease's task name, seed
   and options) and the group's problem (``problem_split``, ``problem_index``);
2. turn 1 of all ``n`` episodes is one ``generate_group(prompt_ids, n)`` call seeded like a
   single-turn group (completion ``j`` from ``(seed, j)``);
3. each later turn of episode ``j`` is one completion of the whole context so far, seeded with
   :func:`turn_seed` ``(seed, j, turn)``, so a re-issued group is generated identically;
4. after each model turn the environment steps on the turn's text
   (``tasks.episode_tokens.model_turn_text``); the episode stops when the environment says
   done, after ``max_turns`` turns, or when the next environment turn plus one model token
   would not fit the token budget (``max_episode_tokens``, and the backend's ``n_ctx``);
   otherwise the observation's tokens (``tasks.interface.env_turn_ids``) are appended.

The result of an episode is everything after the initial prompt: token ids, behaviour log-probs
(0.0 on environment tokens) and the mask (1 = model token). No trailing environment turn is
sent: the learner's replay needs only the model's turns.

The HF tokenizer (chat template) comes from the model resolver's HF directory
(``node_agents.models.resolve_for_backend(model, "torch")``: converted once from the GGUF and
cached) and is loaded once, at the first multi-turn lease. It needs transformers and torch (the
``torch`` extra): a llama.cpp node without them stops at its first multi-turn lease, saying so.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from node_agents.backends.base import SamplingParams
from tasks.base import SPLITS
from tasks.episode_tokens import episode_prompt, model_turn_text, special_ids
from tasks.interface import env_turn_ids, is_env_task

log = logging.getLogger("echo_swarm.node")

#: What loading the HF tokenizer of a GGUF takes (``common.model_cache`` dequantises it with both).
TOKENIZER_NEEDS = ("transformers", "torch")


class EpisodeError(ValueError):
    """A multi-turn lease the node cannot run (unknown task, bad options or problem reference)."""


class TaskUnavailable(EpisodeError):
    """The lease's task is not installed on this node, or at another version than the learner's:
    no lease of the run can be served, so the node stops with this message (a plugin's code is
    never fetched over the network)."""


@dataclass
class EpisodeRollout:
    """One finished episode in the wire's shape (see ``swarm.proto.rollouts.Completion``)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    """How the last model turn ended (``stop`` or ``length``)."""
    mask: list[int]
    turns: int = 0
    model_tokens: int = 0
    """Tokens the model generated (the 1s of ``mask``)."""


def turn_seed(group_seed: int, j: int, turn: int) -> int:
    """Sampling seed of turn ``turn`` (>= 1, 0-based) of episode ``j`` of a group."""
    digest = hashlib.sha256(f"{group_seed}:{j}:{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def run_group_episodes(backend: Any, tokenizer: Any, task: Any, problem: Any, prompt_ids: list[int], n: int,
                       params: SamplingParams, max_turns: int, max_episode_tokens: int) -> list[EpisodeRollout]:
    """``n`` episodes of ``task`` on ``problem`` starting from ``prompt_ids`` (module docstring)."""
    budget = int(max_episode_tokens)
    n_ctx = getattr(backend, "n_ctx", None)
    if n_ctx:
        budget = min(budget, int(n_ctx) - len(prompt_ids))
    if budget < 1:
        raise EpisodeError(f"no room for an episode: prompt of {len(prompt_ids)} tokens, budget {max_episode_tokens}, "
                           f"n_ctx {n_ctx}")
    turns = min(int(max_turns), int(task.max_turns))
    first_params = SamplingParams(params.temperature, params.top_p, min(params.max_tokens, budget), params.seed)
    firsts = backend.generate_group(list(prompt_ids), n, first_params)
    specials = special_ids(tokenizer)
    return [_episode(backend, tokenizer, specials, task, problem, prompt_ids, c, j, params, turns, budget)
            for j, c in enumerate(firsts)]


def _episode(backend, tokenizer, specials, task, problem, prompt_ids, first, j: int, params: SamplingParams,
             max_turns: int, budget: int) -> EpisodeRollout:
    env = task.make_env()
    env.reset(problem)
    ids: list[int] = []
    logprobs: list[float] = []
    mask: list[int] = []
    comp, turn = first, 0
    while True:
        ids += comp.token_ids
        logprobs += comp.logprobs
        mask += [1] * len(comp.token_ids)
        turn += 1
        text, stop_text = model_turn_text(tokenizer, comp.token_ids, specials)
        obs, done = env.step(text)
        if done or turn >= max_turns:
            break
        more = env_turn_ids(tokenizer, obs, stop_text)
        if len(ids) + len(more) >= budget:  # no room for another model token
            break
        ids += more
        logprobs += [0.0] * len(more)
        mask += [0] * len(more)
        p = SamplingParams(params.temperature, params.top_p, min(params.max_tokens, budget - len(ids)),
                           turn_seed(params.seed, j, turn))
        comp = backend.generate_group(list(prompt_ids) + ids, 1, p)[0]
    return EpisodeRollout(ids, logprobs, comp.finish_reason, mask, turn, sum(mask))


@dataclass
class EpisodeRunner:
    """The node's multi-turn side: the HF tokenizer and the lease's task, each built once."""

    model: str = "default"
    """The node's base model (``NodeConfig.model``); its HF directory holds the tokenizer."""
    cache_dir: str | None = None
    """Model cache root (``None``: ``$ECHO_SWARM_CACHE`` or the XDG cache)."""
    _tokenizer: Any = None
    _tasks: dict = field(default_factory=dict)
    _warned_prompt: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                missing = [p for p in TOKENIZER_NEEDS if importlib.util.find_spec(p) is None]
                if missing:  # a llama.cpp node from the `node` extra
                    raise TaskUnavailable(f"multi-turn tasks need the model's HF tokenizer on the node, which needs "
                                          f"{' and '.join(missing)}: pip install 'echo-swarm[torch]'")
                from transformers import AutoTokenizer

                from node_agents.models import resolve_for_backend

                hf_dir = resolve_for_backend(self.model, "torch", self.cache_dir)
                self._tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
            return self._tokenizer

    def task(self, name: str, seed: int, options: dict, version: str = "") -> Any:
        """The task of a lease (cached per name, seed and options), at the lease's ``version``."""
        from tasks.plugins import TaskNotInstalled, check_node_task
        from tasks.registry import make_task

        key = (name, int(seed), json.dumps(options, sort_keys=True, default=str))
        if key not in self._tasks:
            try:
                task = make_task(SimpleNamespace(name=name, seed=int(seed), options=dict(options)))
            except TaskNotInstalled as e:
                raise TaskUnavailable(f"this node cannot run the run's multi-turn task {name!r}: {e}") from None
            except (ValueError, TypeError) as e:
                raise EpisodeError(f"cannot build task {name!r}: {e}") from None
            if not is_env_task(task):
                raise EpisodeError(f"task {name!r} has no multi-turn environment")
            try:
                check_node_task(name, version, task)
            except ValueError as e:
                raise TaskUnavailable(str(e)) from None
            self._tasks[key] = task
        else:
            try:
                check_node_task(name, version, self._tasks[key])
            except ValueError as e:
                raise TaskUnavailable(str(e)) from None
        return self._tasks[key]

    def run_group(self, backend: Any, lease: Any, group: Any, params: SamplingParams) -> list[EpisodeRollout]:
        """The ``lease.group_size`` episodes of ``group`` (a ``PromptGroup`` of a multi-turn lease)."""
        if group.problem_split not in SPLITS or group.problem_index < 0:
            raise EpisodeError(f"group {group.group_id}: bad problem reference "
                               f"({group.problem_split!r}, {group.problem_index})")
        if lease.max_turns < 1 or lease.max_episode_tokens < 1:
            raise EpisodeError("a multi-turn lease needs max_turns >= 1 and max_episode_tokens >= 1")
        task = self.task(lease.episode, lease.task_seed, lease.task_options, getattr(lease, "task_version", ""))
        tokenizer = self.tokenizer()
        problem = task.problem(group.problem_split, group.problem_index)
        if not self._warned_prompt and episode_prompt(task, tokenizer, problem) != list(group.prompt_ids):
            self._warned_prompt = True
            log.warning("the learner's prompt for %s differs from this node's rendering: tokenizers disagree, "
                        "expect the learner to reject these episodes", group.group_id)
        return run_group_episodes(backend, tokenizer, task, problem, list(group.prompt_ids), lease.group_size,
                                  params, lease.max_turns, lease.max_episode_tokens)
