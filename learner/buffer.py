"""Replay buffer of completed GRPO groups, tagged with the adapter version that made them.

Pure (no I/O, no clocks): the coordinator owns one and records every decision in its ledger.

Rules (``S`` = ``sync.max_staleness``; ``u`` = the learner's current policy version, i.e. the
version the next batch trains; a group made with adapter version ``v`` has staleness ``u - v``):

- **Whole groups only.** A group enters with all its completions or not at all.
- **Admission:** a group with ``u - v > S`` is refused on arrival (dropped, reason ``stale``).
- **Expiry:** when ``u`` advances, groups that fall outside the bound are dropped (``stale``).
- **Batches:** :meth:`ReplayBuffer.take` hands out the oldest admissible groups first (lowest
  ``v``, then arrival order), so data is used before it expires; each group leaves the buffer
  once, so it is trained at most once.
- **Bounded memory / eviction:** at most ``capacity`` groups are held. When a new group would
  exceed it, the group with the oldest version (ties: the earliest arrival) is evicted
  (reason ``evicted``): it is the one closest to expiring and the least on-policy.
- **Groups awaiting verification** stay in the buffer (they count toward ``capacity``, expire
  and may be evicted like any other) but :meth:`ReplayBuffer.ready` and
  :meth:`ReplayBuffer.take` pass over the ids in ``skip`` (the coordinator's held groups).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any

STALE, EVICTED = "stale", "evicted"


def staleness(train_version: int, rollout_version: int) -> int:
    """How many versions behind the trained policy a rollout is."""
    return int(train_version) - int(rollout_version)


def admissible(train_version: int, rollout_version: int, max_staleness: int) -> bool:
    """May a rollout of ``rollout_version`` be trained at ``train_version``?"""
    return 0 <= staleness(train_version, rollout_version) <= max_staleness


@dataclass
class ReplayBuffer:
    """Completed groups waiting to be trained. ``groups`` maps group id to any object with
    ``.result.version`` (a :class:`learner.coordinator.CompletedGroup`)."""

    max_staleness: int
    #: Most groups held at once (>= 1).
    capacity: int
    groups: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ValueError("max_staleness must be >= 0")
        if self.capacity < 1:
            raise ValueError("capacity must be >= 1")

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, group_id: str, group: Any, current_version: int) -> dict[str, str]:
        """Admit a group; returns ``{group_id: reason}`` for every group dropped by this call
        (possibly the new one itself)."""
        if not admissible(current_version, group.result.version, self.max_staleness):
            return {group_id: STALE}
        self.groups[group_id] = group
        dropped: dict[str, str] = {}
        while len(self.groups) > self.capacity:
            oldest = min(self.groups, key=lambda g: self.groups[g].result.version)  # dict order breaks ties
            del self.groups[oldest]
            dropped[oldest] = EVICTED
        return dropped

    def expire(self, current_version: int) -> dict[str, str]:
        """Drop the groups that ``current_version`` has left behind."""
        gone = [g for g, c in self.groups.items()
                if not admissible(current_version, c.result.version, self.max_staleness)]
        for g in gone:
            del self.groups[g]
        return {g: STALE for g in gone}

    def ready(self, current_version: int, skip: Container[str] = ()) -> int:
        """Groups a batch at ``current_version`` could use now (those in ``skip`` are not counted)."""
        return sum(admissible(current_version, c.result.version, self.max_staleness)
                   for g, c in self.groups.items() if g not in skip)

    def take(self, n: int, current_version: int,
             skip: Container[str] = ()) -> tuple[list[tuple[str, Any]], dict[str, str]]:
        """Up to ``n`` admissible groups not in ``skip``, oldest first, removed from the buffer;
        plus the groups dropped as stale on the way."""
        dropped = self.expire(current_version)
        order = sorted((g for g in self.groups if g not in skip),
                       key=lambda g: self.groups[g].result.version)  # stable: arrival order
        taken = [(g, self.groups.pop(g)) for g in order[:max(0, n)]]
        return taken, dropped
