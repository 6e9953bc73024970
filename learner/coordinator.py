"""Work coordination as a pure state machine: prompt groups, leases, results, expiry.

No I/O and no clocks: every call takes ``now`` (seconds, any monotonic origin), so the
rules are unit-testable and the network service around it stays thin.

Every prompt group is accounted for in :attr:`Coordinator.ledger` (:class:`~learner.group_ledger.GroupLedger`,
the only writer of group states, its pending queue and the leases) with one state:
``pending`` (waiting for a node), ``leased``, ``held`` (rollouts received and acknowledged,
waiting for the verification of their push: not handed to training), ``completed`` (rollouts
kept, not yet trained), ``trained``, or ``dropped`` (with a reason). A group is trained at most once; a lease
that expires puts its unfinished groups back at the front of the queue, and a late result
for a group that nobody else has completed yet is still accepted, so no work is lost.
Peers that take leases and let them expire are kept in check by the lease rules
(:mod:`learner.lease_rules`: probation, no hand-back, backup leases).
A group whose result is rejected on its merits (malformed, failed verification) goes back to
the front of the queue at once, so one node's bad push never stalls a step; the rejection is
counted in :attr:`Coordinator.rejections`.

Holds (:meth:`Coordinator.hold`): the accepted groups of a push whose sampled groups are being
re-scored (``learner/verify_queue.py``) are ``held`` under one hold id; :meth:`Coordinator.release`
makes them ``completed`` (trainable), :meth:`Coordinator.revoke_peer` (the peer failed) and
:meth:`Coordinator.discard_hold` (the check could not run) throw them away and make them
``pending`` again. ``take``, ``take_batch``, ``ready`` and ``completed_ids`` never see a held group.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from typing import Callable

from learner.buffer import ReplayBuffer
from learner.group_ledger import (GroupEvent, GroupLedger, GroupState, LeaseRecord, LedgerStats,  # noqa: F401
                                  MAX_EXPIRED_LEASES)
from learner.holds import HoldBook
from learner.lease_rules import Probation, backup_groups
from learner.rollout_checks import Limits, validate_group  # noqa: F401 (Limits re-exported)
from learner.work_items import CompletedGroup, CoordinatorStats, GroupSpec, PeerWork  # noqa: F401 (re-exported)
from swarm.proto.rollouts import GroupResult

PENDING, LEASED, HELD = GroupState.PENDING, GroupState.LEASED, GroupState.HELD
COMPLETED, TRAINED, DROPPED = GroupState.COMPLETED, GroupState.TRAINED, GroupState.DROPPED


class Coordinator:
    """Hands out leases of prompt groups and collects their rollouts; every change of a group's
    state goes through its :class:`~learner.group_ledger.GroupLedger`."""

    def __init__(self, limits: Limits, lease_timeout_s: float, groups_per_lease: int,
                 buffer: ReplayBuffer | None = None,
                 verify: Callable[[GroupSpec, GroupResult], str | None] | None = None):
        self.limits = limits
        self.buffer = buffer
        self.lease_timeout_s = lease_timeout_s
        self.groups_per_lease = groups_per_lease
        #: Adapter version that new leases are generated with.
        self.version = 0
        #: Every group's state, the pending queue and the leases (read-only to everyone else).
        self.ledger = GroupLedger(MAX_EXPIRED_LEASES)
        self._specs: dict[str, GroupSpec] = {}
        self.completed: dict[str, CompletedGroup] = buffer.groups if buffer is not None else {}
        #: Groups dropped per reason since the last :meth:`take_drop_counts`.
        self.drop_counts: Counter[str] = Counter()
        #: Optional deeper check of an arriving group after :func:`validate_group`:
        #: ``verify(spec, result) -> reason or None`` (multi-turn runs replay the episodes).
        self.verify = verify
        #: Results refused on their merits, per reason (their groups went back to pending).
        self.rejections: Counter[str] = Counter()
        #: Group -> peers whose result for it was refused; it is not leased to them again.
        self.refused_by: dict[str, set[str]] = {}
        #: Results thrown away after acceptance (their peer turned out untrusted), per reason.
        self.discarded: Counter[str] = Counter()
        #: Pipeline failovers per path (``replayed``, ``stage_lost: re-leased``) ...
        self.failovers: Counter[str] = Counter()
        #: ... and, per group, the paths it took (the ledger's notes beside its state).
        self.notes: dict[str, list[str]] = {}
        #: Who is on probation, with how many strikes (``learner/lease_rules.py``) ...
        self.probation = Probation()
        #: ... and the backup leases given out because a group's holder was on probation.
        self.backups = 0
        self._ids = itertools.count()
        #: Pushes waiting for verification (``learner/holds.py``).
        self.hold_book = HoldBook(self.ledger, lambda: f"H{next(self._ids)}")

    # -- adding work ---------------------------------------------------------------------
    def add_groups(self, specs: list[GroupSpec]) -> None:
        for s in specs:
            self.ledger.add(s.group_id)
            self._specs[s.group_id] = s

    def spec(self, group_id: str) -> GroupSpec:
        """The prompt group ``group_id`` (``KeyError`` if it was never added)."""
        return self._specs[group_id]

    def set_version(self, version: int) -> None:
        self.version = version
        if self.buffer is not None:
            self._record_drops(self.buffer.expire(version))

    def in_flight(self) -> int:
        """Groups added but not yet trained or dropped (pending, leased, held or completed)."""
        return self.ledger.in_flight()

    def open_problem_refs(self) -> list[str]:
        """The problems of every group not yet trained or dropped, in the order they were added."""
        return [self._specs[g].problem_ref for g in self.ledger.open_groups()]

    # -- leases ----------------------------------------------------------------------------
    def lease(self, peer_id: str, max_groups: int, now: float, limit: int | None = None,
              timeout_s: Callable[[int], float] | None = None) -> LeaseRecord | None:
        """Take up to ``max_groups`` pending groups for ``peer_id``; ``None`` if none wait.
        ``limit`` replaces ``groups_per_lease`` (a pipeline head's groups in flight);
        ``timeout_s(n_groups)`` replaces ``lease_timeout_s`` (``lease_rules.lease_timeout_s``)."""
        self.expire(now)
        held = self.ledger.leases_held(peer_id)
        n = self.probation.lease_size(peer_id, max(1, min(max_groups, self.groups_per_lease if limit is None else limit)),
                                      held)
        # groups this peer's results were refused for, or it let expire, are left to others
        taken = self.ledger.take_pending(n, lambda gid: peer_id in self.refused_by.get(gid, ())
                                         or self.probation.keeps_from(gid, peer_id, now, self.lease_timeout_s)
                                         or self.probation.keeps_reissued(gid, peer_id, gid in self.refused_by, now))
        self.probation.leased(taken)
        backup = not taken and n > 0 and held == 0
        if backup:  # nothing pending: back up a group held by a peer on probation (lease_rules.py)
            taken = backup_groups(peer_id, n, self.ledger.leases.values(), self.ledger, self.probation, LEASED, now)
        if not taken:
            return None
        lease = self.ledger.open_lease(f"L{next(self._ids)}", peer_id, taken, self.version, now,
                                       now + (timeout_s(len(taken)) if timeout_s is not None else self.lease_timeout_s))
        if backup:
            for gid in taken:
                self.notes.setdefault(gid, []).append(f"backup lease ({lease.lease_id})")
            self.backups += len(taken)
        return lease

    def expire(self, now: float) -> list[str]:
        """Return the groups of leases past their deadline to the front of the queue."""
        requeued: list[str] = []
        for lid in self.ledger.due(now):
            lease = self.ledger.end_lease(lid, expired=True)
            assert lease is not None
            self.probation.expired(lease.peer_id, lease.open_groups, now)
            requeued += self._requeue_open(lease, lease.group_ids)
        return requeued

    def release_peer(self, peer_id: str) -> list[str]:
        """A peer is known to be gone: re-queue its open groups now."""
        requeued: list[str] = []
        for lease in self.ledger.leases_of(peer_id):
            self.ledger.end_lease(lease.lease_id)
            requeued += self._requeue_open(lease, lease.group_ids)
        return requeued

    def _requeue_open(self, lease: LeaseRecord, group_ids: list[str]) -> list[str]:
        """The groups of ``group_ids`` still open in ``lease`` and leased go back to the front
        of the queue, in their order. Returns them."""
        back = [g for g in group_ids if g in lease.open_groups and self.ledger.get(g) == LEASED]
        for gid in reversed(back):
            self.ledger.apply(gid, GroupEvent.REQUEUE)
        return back

    def release_groups(self, peer_id: str, lease_id: str, group_ids: list[str], reason: str) -> list[str]:
        """The holder of a lease says it cannot finish ``group_ids`` (a pipeline stage died and no
        spare was left): they go back to pending at once, at the front of the queue, instead of
        after the lease's expiry. Only the peer's own open groups move. Returns them."""
        lease = self.ledger.leases.get(lease_id)
        if lease is None or lease.peer_id != peer_id:
            return []
        back = self._requeue_open(lease, group_ids)
        for gid in back:
            self.notes.setdefault(gid, []).append(f"{reason} ({lease_id})")
            self.ledger.close_group(lease, gid)
        if back:
            self.failovers[reason] += len(back)
        return back

    def record_replayed(self, peer_id: str, lease_id: str, group_ids: list[str]) -> int:
        """Note that ``group_ids`` of ``peer_id``'s lease survived a lost stage by replay into a
        spare (they arrive as usual). Returns how many were noted."""
        lease = self.ledger.known_lease(lease_id)
        if lease is None or lease.peer_id != peer_id:
            return 0
        mine = [g for g in group_ids if g in lease.group_ids]
        for gid in mine:
            self.notes.setdefault(gid, []).append(f"replayed ({lease_id})")
        if mine:
            self.failovers["replayed"] += len(mine)
        return len(mine)

    def next_deadline(self) -> float | None:
        return self.ledger.next_deadline()

    def next_backup_at(self, now: float) -> float | None:
        """The next time after ``now`` a lease held by a peer on probation becomes old enough to
        be backed up (``learner/lease_rules.py``); None when none will."""
        age = self.probation.backup_age()
        if age is None:
            return None
        return min((le.issued_at + age for le in self.ledger.leases.values()
                    if le.issued_at + age > now and self.probation.on_probation(le.peer_id)), default=None)

    # -- results ---------------------------------------------------------------------------
    def submit(
        self, peer_id: str, lease_id: str, results: list[GroupResult], now: float, proven: bool = True
    ) -> tuple[list[str], dict[str, str]]:
        """Accept the valid groups of a push. Returns (accepted group ids, rejections).
        ``proven=False``: the groups are held for verification (``learner/verify_queue.py``), so
        the push counts for the peer's probation (``lease_rules.Probation.accepted``) only when
        its hold is released: a made-up push that is accepted and then fails its check never
        takes a peer off probation."""
        lease = self.ledger.known_lease(lease_id)
        accepted: list[str] = []
        rejected: dict[str, str] = {}
        for r in results:
            reason = self._reason(r, lease, peer_id)
            if reason is not None:
                rejected[r.group_id] = reason
                self._requeue_rejected(r.group_id, lease, peer_id, reason)
                if reason == "already_completed" and lease is not None and lease.peer_id == peer_id:
                    self.ledger.close_group(lease, r.group_id)  # answered late: no longer this lease's to hold
                continue
            assert lease is not None
            self.ledger.apply(r.group_id, GroupEvent.ACCEPT)
            self.ledger.close_group(lease, r.group_id)
            group = CompletedGroup(self._specs[r.group_id], r, peer_id, now)
            if self.buffer is None:
                self.completed[r.group_id] = group
            else:
                drops = self.buffer.add(r.group_id, group, self.version)
                self._record_drops(drops)
                if r.group_id in drops:
                    rejected[r.group_id] = f"{drops[r.group_id]}: made with v{r.version}, learner at v{self.version}"
                    continue
            accepted.append(r.group_id)
        if accepted:
            age = now - lease.issued_at if lease is not None else math.nan
            if proven:
                self.probation.accepted(peer_id, age)
            else:
                self.probation.held(accepted, peer_id, age)
        return accepted, rejected

    def late_results(self, peer_id: str, lease_id: str, results: list[GroupResult]) -> list[GroupResult]:
        """The results of ``results`` that answer a group still open in ``peer_id``'s own lease
        after another holder's result came first (a backup lease, ``lease_rules``), and that would
        have been accepted otherwise: never trained, but still worth a check of the peer (call
        before :meth:`submit`, which closes them in the lease)."""
        lease = self.ledger.known_lease(lease_id)
        if lease is None or lease.peer_id != peer_id:
            return []
        late = {r.group_id: r for r in results
                if r.group_id in lease.open_groups and self.ledger.get(r.group_id) in (HELD, COMPLETED, TRAINED)
                and validate_group(r, lease, self.limits) is None
                and (self.verify is None or self.verify(self._specs[r.group_id], r) is None)}
        return list(late.values())

    def vouch(self, peer_id: str) -> None:
        """``peer_id`` passed a check of a result that came late (:meth:`late_results`): it counts
        as an accepted push for its probation, though nothing of it trains."""
        self.probation.accepted(peer_id, math.nan)

    def refuse_push(self, peer_id: str, lease_id: str, group_ids: list[str], reason: str) -> dict[str, str]:
        """Refuse a whole push unread (e.g. the peer is over its push rate): its open groups go
        back to pending at once. Returns the per-group rejections for the ack."""
        lease = self.ledger.leases.get(lease_id)
        for gid in group_ids:
            self._requeue_rejected(gid, lease, peer_id, reason)
        return {gid: reason for gid in group_ids}

    def revoke_peer(self, peer_id: str, reason: str) -> list[str]:
        """``peer_id`` is untrusted: its leases are revoked and every result of its that is not
        yet trained (completed or held) is thrown away (counted as dropped for ``reason``); all
        those groups are pending again for other peers. Returns the re-issued group ids."""
        back = self.release_peer(peer_id)
        for gid, group in list(self.completed.items()):
            if group.peer_id == peer_id and self.ledger.get(gid) in (COMPLETED, HELD):
                self._discard(gid, reason)
                back.append(gid)
        for gid in back:
            self.refused_by.setdefault(gid, set()).add(peer_id)
        return back

    # -- holds (verification after the ack) ------------------------------------------------
    @property
    def holds(self) -> dict[str, list[str]]:
        """Hold id -> its groups still held."""
        return self.hold_book.holds

    @property
    def held(self) -> dict[str, str]:
        """Held group -> its hold id."""
        return self.hold_book.held

    def hold(self, group_ids: list[str], into: str | None = None) -> str | None:
        """:meth:`learner.holds.HoldBook.hold`: keep completed groups from training until released."""
        return self.hold_book.hold(group_ids, into)

    def holding(self, hold_id: str) -> list[str]:
        return self.hold_book.holding(hold_id)

    def release(self, hold_id: str) -> list[str]:
        """The hold passed verification: its groups still held become completed, and their push
        counts for its peer's probation (:meth:`submit`). Returns them."""
        gids = self.hold_book.release(hold_id)
        self.probation.passed(gids)
        return gids

    def discard_hold(self, hold_id: str, reason: str, not_to: str | None = None) -> list[str]:
        """The hold could not be verified: its groups still held are thrown away (dropped for
        ``reason``) and pending again at the front of the queue, for any peer but ``not_to``.
        Returns them."""
        gids = self.holding(hold_id)
        for gid in reversed(gids):
            self._discard(gid, reason)
            if not_to is not None:
                self.refused_by.setdefault(gid, set()).add(not_to)
        return gids

    def untake(self, groups: list[CompletedGroup]) -> list[str]:
        """Sequential mode: groups a training step took and then did not train (the step was
        abandoned before any update: a check on its forward failed, :mod:`learner.step_check`)
        are completed again, to be taken by the step's next attempt. Returns their ids."""
        if self.buffer is not None:
            raise ValueError("untake is for sequential mode (no replay buffer)")
        out = []
        for g in groups:
            gid = g.spec.group_id
            if self.ledger.get(gid) == TRAINED:
                self.completed[gid] = g
                self.ledger.apply(gid, GroupEvent.UNTRAIN)
                out.append(gid)
        return out

    def _discard(self, gid: str, reason: str) -> None:
        """Throw away the untrained result of ``gid`` (completed or held): pending again."""
        self.hold_book.forget(gid)
        self.probation.forget(gid)
        self.completed.pop(gid, None)
        self.drop_counts[reason] += 1
        self.discarded[reason] += 1
        self.ledger.apply(gid, GroupEvent.DISCARD)

    def _requeue_rejected(self, gid: str, lease: LeaseRecord | None, peer_id: str, reason: str) -> None:
        """A result refused on its merits: its group goes back to pending at once (front of
        the queue) instead of waiting for the lease to expire."""
        if (lease is None or self.ledger.leases.get(lease.lease_id) is not lease or lease.peer_id != peer_id
                or gid not in lease.group_ids
                or gid not in lease.open_groups or self.ledger.get(gid) != LEASED):
            return  # not this peer's open group: nothing of it to give back
        self.refused_by.setdefault(gid, set()).add(peer_id)
        self.ledger.apply(gid, GroupEvent.REQUEUE)
        self.ledger.close_group(lease, gid)
        self.rejections[reason.split(":")[0].split(" ")[0]] += 1

    def _reason(self, r: GroupResult, lease: LeaseRecord | None, peer_id: str) -> str | None:
        if lease is None:
            return "unknown_or_expired_lease"
        if lease.peer_id != peer_id:
            return "lease_of_another_peer"
        state = self.ledger.get(r.group_id)
        if state in (HELD, COMPLETED, TRAINED):
            return "already_completed"
        if state is None or state is DROPPED:
            return f"group_not_open ({self.ledger.label(r.group_id)})"
        reason = validate_group(r, lease, self.limits)
        if reason is None and self.verify is not None:
            reason = self.verify(self._specs[r.group_id], r)
        return reason

    # -- batches ---------------------------------------------------------------------------
    def completed_ids(self, version: int | None = None) -> list[str]:
        """Completed (not held) groups, of ``version`` if given."""
        return [g for g, c in self.completed.items()
                if g not in self.held and (version is None or c.result.version == version)]

    def take(self, group_ids: list[str]) -> list[CompletedGroup]:
        """Hand completed groups to the trainer; each can be taken once (a held one cannot)."""
        out = []
        for gid in group_ids:
            if self.ledger.get(gid) != COMPLETED:
                raise ValueError(f"group {gid} is {self.ledger.label(gid)}, not completed")
            out.append(self.completed.pop(gid))
            self.ledger.apply(gid, GroupEvent.TRAIN)
        return out

    def take_batch(self, n: int) -> list[CompletedGroup]:
        """Asynchronous mode: up to ``n`` admissible groups for the current version, oldest
        first (see :class:`~learner.buffer.ReplayBuffer`); stale ones are dropped on the way."""
        if self.buffer is None:
            raise ValueError("take_batch needs a replay buffer (asynchronous mode)")
        taken, drops = self.buffer.take(n, self.version, skip=self.held)
        self._record_drops(drops)
        for gid, _ in taken:
            self.ledger.apply(gid, GroupEvent.TRAIN)
        return [g for _, g in taken]

    def ready(self) -> int:
        """Completed (not held) groups that the current version may train on."""
        if self.buffer is None:
            return sum(g not in self.held for g in self.completed)
        return self.buffer.ready(self.version, skip=self.held)

    def drop(self, group_id: str, reason: str) -> None:
        self.completed.pop(group_id, None)
        self._record_drops({group_id: reason})

    def _record_drops(self, drops: dict[str, str]) -> None:
        for gid, reason in drops.items():
            self.hold_book.forget(gid)
            self.ledger.apply(gid, GroupEvent.DROP, reason)
            self.drop_counts[reason] += 1

    def take_drop_counts(self) -> dict[str, int]:
        out, self.drop_counts = dict(self.drop_counts), Counter()
        return out

    def counts(self) -> dict[str, int]:
        """Groups per state, dropped ones as ``dropped:<reason>`` (what ``ledger.json`` holds)."""
        return self.ledger.counts()

    def statistics(self) -> CoordinatorStats:
        """A snapshot for readers (the dashboard, the report): nothing in it changes later."""
        ledger = self.ledger.statistics()
        newest = {p: pl.newest_version for p, pl in ledger.peers.items()}
        oldest: dict[str, int] = {}
        for group in self.completed.values():
            v = group.result.version
            newest[group.peer_id] = max(newest.get(group.peer_id, -1), v)
            oldest[group.peer_id] = min(oldest.get(group.peer_id, v), v)
        peers = {p: PeerWork(ledger.peers[p].open_groups if p in ledger.peers else 0, v, oldest.get(p))
                 for p, v in newest.items()}
        return CoordinatorStats(self.version, ledger, len(self.completed), peers, dict(self.failovers))
