"""What a pushed group must satisfy to be accepted, checked before anything else looks at it:
it belongs to the lease, carries the lease's version and the group's size, and every
completion is well-formed (token ids in the vocabulary, one finite log-prob <= 0 per sampled
token, a known finish reason, within the token limit; multi-turn episodes: a 0/1 mask that
starts and ends with a model turn, within the turn and episode limits). Pure functions."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

from swarm.proto.rollouts import Completion, GroupResult
from tasks.episode_tokens import mask_runs


class LeaseTerms(Protocol):
    """What a check reads of the lease a group was pushed under (a coordinator's ``LeaseRecord``)."""

    @property
    def group_ids(self) -> Sequence[str]: ...

    @property
    def version(self) -> int: ...


@dataclass
class Limits:
    """What a result must satisfy to be accepted."""

    group_size: int
    max_tokens: int
    vocab_size: int
    #: Behaviour log-probs above this are rejected (they must be <= 0; small slack for rounding).
    max_logprob: float = 1e-3
    #: Multi-turn runs: most model turns per episode (each at most ``max_tokens``). 0 = a
    #: single-turn run, where a completion with a mask is refused.
    max_turns: int = 0
    #: Multi-turn runs: most tokens of an episode after its initial prompt (model and
    #: environment turns together); replaces ``max_tokens`` as the length bound.
    max_episode_tokens: int = 0


def validate_group(result: GroupResult, lease: LeaseTerms, limits: Limits) -> str | None:
    """Why ``result`` is unacceptable for ``lease``, or ``None`` if it is fine."""
    if result.group_id not in lease.group_ids:
        return "group_not_in_lease"
    if result.version != lease.version:
        return f"wrong_version: lease is v{lease.version}, result says v{result.version}"
    if len(result.completions) != limits.group_size:
        return f"group_size: expected {limits.group_size}, got {len(result.completions)}"
    for c in result.completions:
        if len(c.token_ids) != len(c.logprobs):
            return "logprobs_length_mismatch"
        if not c.token_ids:
            return "empty_completion"
        if limits.max_turns > 0:
            reason = _episode_shape(c, limits)
            if reason is not None:
                return reason
        elif c.mask:
            return "unexpected_mask: this run is single-turn"
        elif len(c.token_ids) > limits.max_tokens:
            return "too_many_tokens"
        if any(t < 0 or t >= limits.vocab_size for t in c.token_ids):
            return "token_out_of_vocab"
        mask = c.mask or [1] * len(c.token_ids)
        if any(m and (not math.isfinite(lp) or lp > limits.max_logprob) for lp, m in zip(c.logprobs, mask)):
            return "bad_logprob"
        if any(not m and lp != 0.0 for lp, m in zip(c.logprobs, mask)):
            return "bad_logprob: environment tokens carry 0.0"
        if c.finish_reason not in ("stop", "length"):
            return "bad_finish_reason"
    return None


def _episode_shape(c: Completion, limits: Limits) -> str | None:
    """Structural checks of a multi-turn episode record (its replay is :attr:`Coordinator.verify`)."""
    if not c.mask:
        return "mask_required: this run trains multi-turn episodes"
    if len(c.mask) != len(c.token_ids):
        return "mask_length_mismatch"
    if any(m not in (0, 1) for m in c.mask):
        return "bad_mask"
    if c.mask[0] != 1 or c.mask[-1] != 1:
        return "bad_mask: an episode starts and ends with a model turn"
    if len(c.token_ids) > limits.max_episode_tokens:
        return "too_many_tokens"
    turns = [end - start for value, start, end in mask_runs(c.mask) if value == 1]
    if len(turns) > limits.max_turns:
        return "too_many_turns"
    if max(turns) > limits.max_tokens:
        return "turn_too_long"
    return None
