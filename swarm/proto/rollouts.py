"""Rollout push: a node sends the completions of a lease back to the learner."""

from __future__ import annotations

from dataclasses import dataclass

from swarm.wire import Message, bounded


@dataclass
class Completion(Message):
    KIND = "completion"
    #: Sampled token ids (the completion only, not the prompt).
    token_ids: list[int]
    #: Behaviour log-probability of each sampled token under the policy that sampled it.
    logprobs: list[float]
    #: ``stop`` (end-of-generation token) or ``length`` (hit max_tokens).
    finish_reason: str


@dataclass
class GroupResult(Message):
    KIND = "group_result"
    group_id: str
    #: Adapter version the whole group was generated with.
    version: int = bounded(min=0)
    completions: list[Completion] = bounded(max_items=1024)


@dataclass
class RolloutPush(Message):
    KIND = "rollout_push"
    lease_id: str
    groups: list[GroupResult] = bounded(max_items=1024)
    #: Wall-clock seconds spent generating.
    gen_s: float = bounded(min=0.0)
    #: Completion tokens generated for this push.
    gen_tokens: int = bounded(min=0)
    backend: str = ""


@dataclass
class RolloutAck(Message):
    KIND = "rollout_ack"
    accepted_groups: int = bounded(min=0)
    rejected_groups: int = bounded(min=0)
    #: Reason per rejected group id.
    rejections: dict[str, str]
