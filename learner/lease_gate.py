"""The fair-start gate: hold back every lease until enough distinct nodes wait for work at the
same time, so that each node of a mixed swarm gets a share of a step (the fastest one would
otherwise take everything before the slow ones have loaded).

A pure decision over a snapshot (the waiting peers, the coordinator's version, ``now``); the
work desk (:mod:`learner.work_desk`) asks it before every lease. Its settings are the ``[sync]``
section's ``min_waiting_nodes``, ``regate_each_version`` and ``gate_timeout_s``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from learner.config import SyncConfig


@dataclass
class LeaseGate:
    settings: SyncConfig = field(default_factory=SyncConfig)
    #: Peers in a work long poll right now.
    waiting: set[str] = field(default_factory=set)
    is_open: bool = False
    version: int = 0
    deadline: float | None = None

    def arrive(self, peer_id: str) -> bool:
        """``peer_id`` waits for work; True when the waiters should re-count (gate still closed)."""
        new = peer_id not in self.waiting
        self.waiting.add(peer_id)
        return new and not self.is_open

    def leave(self, peer_id: str) -> None:
        self.waiting.discard(peer_id)

    def closed(self, version: int, now: float) -> tuple[bool, bool]:
        """(closed, opened_now) at coordinator ``version`` and time ``now``; ``opened_now`` tells
        the caller to wake the other waiters."""
        s = self.settings
        if s.regate_each_version and version != self.version:
            self.version, self.is_open = version, False
            self.deadline = now + s.gate_timeout_s
        late = self.deadline is not None and now >= self.deadline
        if self.is_open or late or len(self.waiting) >= s.min_waiting_nodes:
            opened_now = not self.is_open
            self.is_open = True
            return False, opened_now
        return True, False
