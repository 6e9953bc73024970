"""What the coordinator hands out and keeps (:mod:`learner.coordinator`): a prompt group's spec,
a completed group, and the snapshot readers get (:meth:`Coordinator.statistics`)."""

from __future__ import annotations

from dataclasses import dataclass

from learner.group_ledger import LedgerStats
from swarm.proto.rollouts import GroupResult


@dataclass
class GroupSpec:
    """A prompt group waiting to be generated."""

    group_id: str
    prompt_ids: list[int]
    #: Task-side reference (problem index / id) used to recompute the reward.
    problem_ref: str


@dataclass
class CompletedGroup:
    spec: GroupSpec
    result: GroupResult
    peer_id: str
    received_at: float


@dataclass(frozen=True)
class PeerWork:
    """One peer's groups in the coordinator: open groups of its live leases, the newest adapter
    version it is known to hold (from its leases and its untrained results) and the oldest
    version among its results waiting to be trained (None: none wait)."""

    leased_groups: int
    newest_version: int
    oldest_untrained: int | None


@dataclass(frozen=True)
class CoordinatorStats:
    """A snapshot of the coordinator for readers (:meth:`Coordinator.statistics`)."""

    #: Adapter version new leases are generated with.
    version: int
    ledger: LedgerStats
    #: Results kept and not yet trained (held ones included).
    buffered: int
    #: Per peer with a live lease or an untrained result.
    peers: dict[str, PeerWork]
    failovers: dict[str, int]
