"""Rollout push: a node sends the completions of a lease back to the learner."""

from __future__ import annotations

from dataclasses import dataclass

from swarm.wire import Message, WireError, bounded, bounded_default

#: Most tokens of one completion (a multi-turn episode: ``Lease.max_episode_tokens``).
MAX_COMPLETION_TOKENS = 1_000_000


@dataclass
class Completion(Message):
    KIND = "completion"
    #: Sampled token ids (the completion only, not the prompt).
    token_ids: list[int] = bounded(max_items=MAX_COMPLETION_TOKENS)
    #: Behaviour log-probability of each sampled token under the policy that sampled it.
    logprobs: list[float] = bounded(max_items=MAX_COMPLETION_TOKENS)
    #: ``stop`` (end-of-generation token) or ``length`` (hit max_tokens); for a multi-turn
    #: episode, how its last model turn ended.
    finish_reason: str = bounded(max_items=32)
    #: Multi-turn episodes: 1 where the model sampled the token, 0 where the environment
    #: appended it (those carry log-prob 0.0). Empty = every token is a model token (single
    #: turn); otherwise exactly as long as ``token_ids``.
    mask: list[int] = bounded_default([], max_items=MAX_COMPLETION_TOKENS)

    def __post_init__(self) -> None:
        if self.mask:
            if len(self.mask) != len(self.token_ids):
                raise WireError(f"completion.mask: {len(self.mask)} entries for {len(self.token_ids)} tokens")
            if any(m not in (0, 1) or isinstance(m, bool) for m in self.mask):
                raise WireError("completion.mask: entries must be 0 or 1")


@dataclass
class GroupResult(Message):
    KIND = "group_result"
    group_id: str = bounded(max_items=256)
    #: Adapter version the whole group was generated with.
    version: int = bounded(min=0)
    completions: list[Completion] = bounded(max_items=1024)


@dataclass
class RolloutPush(Message):
    KIND = "rollout_push"
    lease_id: str = bounded(max_items=256)
    groups: list[GroupResult] = bounded(max_items=1024)
    #: Wall-clock seconds spent generating.
    gen_s: float = bounded(min=0.0)
    #: Completion tokens generated for this push.
    gen_tokens: int = bounded(min=0)
    backend: str = bounded_default("", max_items=64)


@dataclass
class RolloutAck(Message):
    """The learner accepted ``accepted_groups`` of the push. Accepted is not final: the learner
    may re-score sampled groups after this ack and, if they fail, refuse the node for the rest of
    the run and re-issue its untrained groups."""

    KIND = "rollout_ack"
    accepted_groups: int = bounded(min=0)
    rejected_groups: int = bounded(min=0)
    #: Reason per rejected group id.
    rejections: dict[str, str] = bounded(max_items=1024, max_len=1024)
