"""The fair-start gate: hold back every lease until enough distinct nodes wait for work at the
same time, so that each node of a mixed swarm gets a share of a step (the fastest one would
otherwise take everything before the slow ones have loaded).

A pure decision over a snapshot (the waiting peers, the coordinator's version, ``now``); the
work desk (:mod:`learner.work_desk`) asks it before every lease.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GateSettings:
    """When leases may start."""

    #: Distinct nodes that must wait for work at once before the first lease (0 = no gate).
    #: Once open, the gate stays open (unless ``regate_each_version``).
    min_waiting: int = 0
    #: Close the gate again at every new adapter version (each step's work is then shared among
    #: ``min_waiting`` waiting nodes, e.g. a slow pipeline beside a fast node).
    regate_each_version: bool = False
    #: The longest a re-closed gate waits for its nodes (s); then it opens with whoever waits.
    timeout_s: float = 30.0


@dataclass
class LeaseGate:
    settings: GateSettings = field(default_factory=GateSettings)
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
            self.deadline = now + s.timeout_s
        late = self.deadline is not None and now >= self.deadline
        if self.is_open or late or len(self.waiting) >= s.min_waiting:
            opened_now = not self.is_open
            self.is_open = True
            return False, opened_now
        return True, False
