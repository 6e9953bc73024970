"""The group ledger: the one writer of every prompt group's state, its pending queue and its leases.

A group moves only through :meth:`GroupLedger.apply`, which looks the move up in
:data:`TRANSITIONS` (state x event -> state, written as data, as h11's ``_state.py`` does) and
raises :class:`IllegalTransition` for any move the table does not list. Everyone else reads:
the ledger is a read-only ``Mapping`` of group id -> :class:`GroupState`, and it answers the
questions other parts used to compute by reaching into the coordinator (who holds a lease, how
many leases a peer holds, how many groups are in each state) in O(1) from indexes it keeps as it
writes. :meth:`GroupLedger.statistics` is the typed snapshot readers (the dashboard, the
report) take.

::

    pending --LEASE--> leased --ACCEPT--> completed --TRAIN--> trained
       ^                 |  ^                |  ^  |              |
       +----REQUEUE------+  |(backup LEASE)  |  |  +--HOLD--> held (awaiting its push's check)
       +----------DISCARD--------------------+  +----VERIFY-----+
       (and from held)          completed <--UNTRAIN-- trained (a sequential step abandoned)
    pending, completed, held --DROP(reason)--> dropped

A late result of an expired lease is accepted while nobody else finished the group (``pending
--ACCEPT--> completed``). ``dropped`` is final; its reason is kept beside it and shown as
``dropped:<reason>`` in :meth:`GroupLedger.counts` (the form ``ledger.json`` keeps).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from types import MappingProxyType

#: How many expired leases are remembered for late pushes.
MAX_EXPIRED_LEASES = 10_000


class GroupState(StrEnum):
    PENDING = "pending"
    LEASED = "leased"
    #: Rollouts received and acknowledged, waiting for the verification of their push.
    HELD = "held"
    #: Rollouts kept, not yet trained.
    COMPLETED = "completed"
    TRAINED = "trained"
    DROPPED = "dropped"


class GroupEvent(Enum):
    LEASE = "lease"
    #: The lease expired, its holder is gone or handed it back, or its result was refused.
    REQUEUE = "requeue"
    ACCEPT = "accept"
    HOLD = "hold"
    #: The held push passed its check.
    VERIFY = "verify"
    #: An accepted result is thrown away (its peer is untrusted, or its check could not run).
    DISCARD = "discard"
    TRAIN = "train"
    #: A sequential step took the group and was abandoned before any update.
    UNTRAIN = "untrain"
    DROP = "drop"


S, E = GroupState, GroupEvent
#: Every move a group may make: (state, event) -> the next state.
TRANSITIONS: Mapping[tuple[GroupState, GroupEvent], GroupState] = MappingProxyType({
    (S.PENDING, E.LEASE): S.LEASED,
    (S.LEASED, E.LEASE): S.LEASED,  # a backup lease beside a holder on probation
    (S.LEASED, E.REQUEUE): S.PENDING,
    (S.PENDING, E.ACCEPT): S.COMPLETED,  # a late result nobody else finished
    (S.LEASED, E.ACCEPT): S.COMPLETED,
    (S.COMPLETED, E.HOLD): S.HELD,
    (S.HELD, E.VERIFY): S.COMPLETED,
    (S.COMPLETED, E.DISCARD): S.PENDING,
    (S.HELD, E.DISCARD): S.PENDING,
    (S.COMPLETED, E.TRAIN): S.TRAINED,
    (S.TRAINED, E.UNTRAIN): S.COMPLETED,
    (S.PENDING, E.DROP): S.DROPPED,
    (S.COMPLETED, E.DROP): S.DROPPED,
    (S.HELD, E.DROP): S.DROPPED,
})
#: States whose groups are not finished (neither trained nor dropped).
OPEN_STATES = frozenset({S.PENDING, S.LEASED, S.HELD, S.COMPLETED})


class IllegalTransition(ValueError):
    """A move :data:`TRANSITIONS` does not list (a bug in the caller: nothing was changed)."""


@dataclass
class LeaseRecord:
    lease_id: str
    peer_id: str
    group_ids: list[str]
    version: int
    issued_at: float
    deadline: float
    #: Groups of the lease whose result has not arrived (written by the ledger only).
    open_groups: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class PeerLeases:
    """One peer's part of the ledger: its live leases' open groups and newest lease version."""

    open_groups: int
    newest_version: int


@dataclass(frozen=True)
class LedgerStats:
    """A snapshot of the ledger (:meth:`GroupLedger.statistics`)."""

    #: Groups per state (every state present, zero included).
    states: Mapping[GroupState, int]
    #: Dropped groups per reason.
    dropped: Mapping[str, int]
    #: Live leases.
    active_leases: int
    #: Per peer that holds a live lease.
    peers: Mapping[str, PeerLeases]

    @property
    def total(self) -> int:
        return sum(self.states.values())

    def counts(self) -> dict[str, int]:
        """Non-zero counts with dropped groups as ``dropped:<reason>`` (``ledger.json``'s form)."""
        out = {str(s): n for s, n in self.states.items() if n and s is not S.DROPPED}
        out.update({f"dropped:{r}": n for r, n in self.dropped.items() if n})
        return out


class GroupLedger(Mapping[str, GroupState]):
    """Group id -> state (read-only to everyone), the pending queue and the leases; changed
    only through :meth:`add`, :meth:`apply` and the lease methods."""

    def __init__(self, max_expired: int = MAX_EXPIRED_LEASES) -> None:
        self._state: dict[str, GroupState] = {}
        self._dropped: dict[str, str] = {}
        self._counts: Counter[GroupState] = Counter()
        self._drop_counts: Counter[str] = Counter()
        #: Pending groups in lease order; entries of groups no longer pending are skipped lazily.
        self._queue: deque[str] = deque()
        self._leases: dict[str, LeaseRecord] = {}
        self._by_peer: dict[str, dict[str, LeaseRecord]] = {}
        self._expired: dict[str, LeaseRecord] = {}
        self._max_expired = max_expired

    # -- the read-only mapping ---------------------------------------------------------------
    def __getitem__(self, gid: str) -> GroupState:
        return self._state[gid]

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)

    def label(self, gid: str) -> str | None:
        """The group's state as ``ledger.json`` writes it (``dropped:<reason>`` for a dropped one)."""
        state = self._state.get(gid)
        if state is S.DROPPED:
            return f"dropped:{self._dropped[gid]}"
        return None if state is None else str(state)

    # -- the writers -------------------------------------------------------------------------
    def add(self, gid: str) -> None:
        """A new group, pending at the back of the queue."""
        if gid in self._state:
            raise ValueError(f"group {gid} was already added")
        self._set(gid, S.PENDING)
        self._queue.append(gid)

    def apply(self, gid: str, event: GroupEvent, reason: str = "") -> GroupState:
        """Move ``gid`` by ``event`` (see :data:`TRANSITIONS`); a group that becomes pending
        again goes to the front of the queue; ``reason`` is a drop's. Returns the new state."""
        state = self._state.get(gid)
        new = TRANSITIONS.get((state, event)) if state is not None else None
        if new is None:
            raise IllegalTransition(f"group {gid}: no move from {state} on {event.value}")
        self._set(gid, new)
        if new is S.PENDING:
            self._queue.appendleft(gid)
        elif new is S.DROPPED:
            self._dropped[gid] = reason or "unknown"
            self._drop_counts[self._dropped[gid]] += 1
        return new

    def _set(self, gid: str, state: GroupState) -> None:
        old = self._state.get(gid)
        if old is not None:
            self._counts[old] -= 1
        self._state[gid] = state
        self._counts[state] += 1

    # -- the pending queue -------------------------------------------------------------------
    def take_pending(self, n: int, refused: Callable[[str], bool]) -> list[str]:
        """Up to ``n`` pending groups in queue order, taken off the queue for a new lease (the
        caller leases them at once); groups ``refused`` skips keep their places at the front."""
        taken: list[str] = []
        skipped: list[str] = []
        seen: set[str] = set()
        while self._queue and len(taken) < n:
            gid = self._queue.popleft()
            if self._state.get(gid) is not S.PENDING or gid in seen:
                continue  # a stale entry (the group moved on) or a second entry of one group
            seen.add(gid)
            (skipped if refused(gid) else taken).append(gid)
        self._queue.extendleft(reversed(skipped))
        return taken

    def pending_order(self) -> list[str]:
        """Pending groups in the order they will be leased."""
        seen: set[str] = set()
        out = []
        for gid in self._queue:
            if self._state.get(gid) is S.PENDING and gid not in seen:
                seen.add(gid)
                out.append(gid)
        return out

    # -- leases --------------------------------------------------------------------------------
    def open_lease(self, lease_id: str, peer_id: str, group_ids: list[str], version: int, now: float,
                   deadline: float) -> LeaseRecord:
        """Lease ``group_ids`` (pending, or leased to a peer on probation) to ``peer_id``."""
        for gid in group_ids:
            self.apply(gid, E.LEASE)
        lease = LeaseRecord(lease_id, peer_id, list(group_ids), version, now, deadline, set(group_ids))
        self._leases[lease_id] = lease
        self._by_peer.setdefault(peer_id, {})[lease_id] = lease
        return lease

    def close_group(self, lease: LeaseRecord, gid: str) -> None:
        """``gid``'s result arrived or was refused: it is no longer open in ``lease``; a live
        lease with no open group left is closed."""
        lease.open_groups.discard(gid)
        if not lease.open_groups and self._leases.get(lease.lease_id) is lease:
            self._close(lease)

    def end_lease(self, lease_id: str, expired: bool = False) -> LeaseRecord | None:
        """Close a live lease now (its groups are not touched); ``expired``: keep it for late
        pushes (:meth:`known_lease`)."""
        lease = self._leases.get(lease_id)
        if lease is None:
            return None
        self._close(lease)
        if expired:
            self._expired[lease_id] = lease
            while len(self._expired) > self._max_expired:
                self._expired.pop(next(iter(self._expired)))
        return lease

    def _close(self, lease: LeaseRecord) -> None:
        del self._leases[lease.lease_id]
        mine = self._by_peer.get(lease.peer_id)
        if mine is not None:
            mine.pop(lease.lease_id, None)
            if not mine:
                del self._by_peer[lease.peer_id]

    def due(self, now: float) -> list[str]:
        """Live leases whose deadline has passed."""
        return [lid for lid, lease in self._leases.items() if lease.deadline <= now]

    @property
    def leases(self) -> Mapping[str, LeaseRecord]:
        """Live leases by id (read-only)."""
        return MappingProxyType(self._leases)

    def known_lease(self, lease_id: str) -> LeaseRecord | None:
        """A live lease, or one that expired recently (a late push may still deliver)."""
        return self._leases.get(lease_id) or self._expired.get(lease_id)

    def leases_of(self, peer_id: str) -> list[LeaseRecord]:
        return list(self._by_peer.get(peer_id, {}).values())

    def leases_held(self, peer_id: str) -> int:
        return len(self._by_peer.get(peer_id, ()))

    def busy_peers(self, now: float | None = None, recent_s: float = 0.0) -> set[str]:
        """Peers holding a live lease, and (with ``now``) those whose lease expired less than
        ``recent_s`` ago (a slow holder may still push)."""
        out = set(self._by_peer)
        if now is not None and recent_s > 0:
            out |= {le.peer_id for le in self._expired.values() if now - le.deadline < recent_s}
        return out

    def is_busy(self, peer_id: str) -> bool:
        return peer_id in self._by_peer

    def next_deadline(self) -> float | None:
        return min((lease.deadline for lease in self._leases.values()), default=None)

    # -- counts --------------------------------------------------------------------------------
    def count(self, state: GroupState) -> int:
        return self._counts[state]

    def in_flight(self) -> int:
        """Groups not yet trained or dropped."""
        return sum(self._counts[s] for s in OPEN_STATES)

    def counts(self) -> dict[str, int]:
        """Groups per state, dropped ones per ``dropped:<reason>`` (zero counts left out)."""
        return self.statistics().counts()

    def open_groups(self) -> list[str]:
        """Groups not yet trained or dropped, in the order they were added."""
        return [g for g, s in self._state.items() if s in OPEN_STATES]

    def statistics(self) -> LedgerStats:
        peers: dict[str, PeerLeases] = {}
        for peer, leases in self._by_peer.items():
            peers[peer] = PeerLeases(sum(len(le.open_groups) for le in leases.values()),
                                     max(le.version for le in leases.values()))
        return LedgerStats(states={s: self._counts[s] for s in GroupState},
                           dropped=dict(sorted(self._drop_counts.items())),
                           active_leases=len(self._leases), peers=peers)
