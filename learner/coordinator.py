"""Work coordination as a pure state machine: prompt groups, leases, results, expiry.

No I/O and no clocks: every call takes ``now`` (seconds, any monotonic origin), so the
rules are unit-testable and the network service around it stays thin.

Every prompt group is accounted for in :attr:`Coordinator.ledger` with one state:
``pending`` (waiting for a node), ``leased``, ``completed`` (rollouts held, not yet
trained), ``trained``, or ``dropped:<reason>``. A group is trained at most once; a lease
that expires puts its unfinished groups back at the front of the queue, and a late result
for a group that nobody else has completed yet is still accepted, so no work is lost.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field

from swarm.proto.rollouts import GroupResult

PENDING, LEASED, COMPLETED, TRAINED = "pending", "leased", "completed", "trained"
#: How many expired leases are remembered for late pushes.
MAX_EXPIRED_LEASES = 10_000


@dataclass
class GroupSpec:
    """A prompt group waiting to be generated."""

    group_id: str
    prompt_ids: list[int]
    #: Task-side reference (problem index / id) used to recompute the reward.
    problem_ref: str


@dataclass
class LeaseRecord:
    lease_id: str
    peer_id: str
    group_ids: list[str]
    version: int
    issued_at: float
    deadline: float
    open_groups: set[str] = field(default_factory=set)


@dataclass
class CompletedGroup:
    spec: GroupSpec
    result: GroupResult
    peer_id: str
    received_at: float


@dataclass
class Limits:
    """What a result must satisfy to be accepted."""

    group_size: int
    max_tokens: int
    vocab_size: int
    #: Behaviour log-probs above this are rejected (they must be <= 0; small slack for rounding).
    max_logprob: float = 1e-3


def validate_group(result: GroupResult, lease: LeaseRecord, limits: Limits) -> str | None:
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
        if len(c.token_ids) > limits.max_tokens:
            return "too_many_tokens"
        if any(t < 0 or t >= limits.vocab_size for t in c.token_ids):
            return "token_out_of_vocab"
        if any(not math.isfinite(lp) or lp > limits.max_logprob for lp in c.logprobs):
            return "bad_logprob"
        if c.finish_reason not in ("stop", "length"):
            return "bad_finish_reason"
    return None


class Coordinator:
    """Hands out leases of prompt groups and collects their rollouts."""

    def __init__(self, limits: Limits, lease_timeout_s: float, groups_per_lease: int):
        self.limits = limits
        self.lease_timeout_s = lease_timeout_s
        self.groups_per_lease = groups_per_lease
        #: Adapter version that new leases are generated with.
        self.version = 0
        self.ledger: dict[str, str] = {}
        self.specs: dict[str, GroupSpec] = {}
        self.queue: deque[str] = deque()
        self.leases: dict[str, LeaseRecord] = {}
        self.completed: dict[str, CompletedGroup] = {}
        #: Expired leases, kept so a late push can still deliver groups nobody finished.
        self.expired: dict[str, LeaseRecord] = {}
        self._ids = itertools.count()

    # -- adding work ---------------------------------------------------------------------
    def add_groups(self, specs: list[GroupSpec]) -> None:
        for s in specs:
            if s.group_id in self.ledger:
                raise ValueError(f"group {s.group_id} was already added")
            self.specs[s.group_id] = s
            self.ledger[s.group_id] = PENDING
            self.queue.append(s.group_id)

    def set_version(self, version: int) -> None:
        self.version = version

    # -- leases ----------------------------------------------------------------------------
    def lease(self, peer_id: str, max_groups: int, now: float) -> LeaseRecord | None:
        """Take up to ``max_groups`` pending groups for ``peer_id``; ``None`` if none wait."""
        self.expire(now)
        n = max(1, min(max_groups, self.groups_per_lease))
        taken: list[str] = []
        while self.queue and len(taken) < n:
            gid = self.queue.popleft()
            if self.ledger.get(gid) == PENDING:
                taken.append(gid)
        if not taken:
            return None
        lease = LeaseRecord(
            lease_id=f"L{next(self._ids)}",
            peer_id=peer_id,
            group_ids=taken,
            version=self.version,
            issued_at=now,
            deadline=now + self.lease_timeout_s,
            open_groups=set(taken),
        )
        for gid in taken:
            self.ledger[gid] = LEASED
        self.leases[lease.lease_id] = lease
        return lease

    def expire(self, now: float) -> list[str]:
        """Return the groups of leases past their deadline to the front of the queue."""
        requeued: list[str] = []
        for lid in [lid for lid, lease in self.leases.items() if lease.deadline <= now]:
            lease = self.leases.pop(lid)
            requeued += self._release(lease)
            self.expired[lid] = lease
            while len(self.expired) > MAX_EXPIRED_LEASES:
                self.expired.pop(next(iter(self.expired)))
        return requeued

    def release_peer(self, peer_id: str) -> list[str]:
        """A peer is known to be gone: re-queue its open groups now."""
        requeued: list[str] = []
        for lid in [lid for lid, lease in self.leases.items() if lease.peer_id == peer_id]:
            requeued += self._release(self.leases.pop(lid))
        return requeued

    def _release(self, lease: LeaseRecord) -> list[str]:
        back = [g for g in lease.group_ids if g in lease.open_groups and self.ledger.get(g) == LEASED]
        for gid in reversed(back):
            self.ledger[gid] = PENDING
            self.queue.appendleft(gid)
        return back

    def next_deadline(self) -> float | None:
        return min((lease.deadline for lease in self.leases.values()), default=None)

    # -- results ---------------------------------------------------------------------------
    def submit(
        self, peer_id: str, lease_id: str, results: list[GroupResult], now: float
    ) -> tuple[list[str], dict[str, str]]:
        """Accept the valid groups of a push. Returns (accepted group ids, rejections)."""
        lease = self.leases.get(lease_id)
        accepted: list[str] = []
        rejected: dict[str, str] = {}
        if lease is None:
            lease = self.expired.get(lease_id)
        for r in results:
            reason = self._reason(r, lease, peer_id)
            if reason is not None:
                rejected[r.group_id] = reason
                continue
            self.completed[r.group_id] = CompletedGroup(self.specs[r.group_id], r, peer_id, now)
            self.ledger[r.group_id] = COMPLETED
            accepted.append(r.group_id)
            if lease is not None:
                lease.open_groups.discard(r.group_id)
        if lease is not None and lease.lease_id in self.leases and not lease.open_groups:
            del self.leases[lease.lease_id]
        return accepted, rejected

    def _reason(self, r: GroupResult, lease: LeaseRecord | None, peer_id: str) -> str | None:
        if lease is None:
            return "unknown_or_expired_lease"
        if lease.peer_id != peer_id:
            return "lease_of_another_peer"
        state = self.ledger.get(r.group_id)
        if state in (COMPLETED, TRAINED):
            return "already_completed"
        if state is None or state.startswith("dropped"):
            return f"group_not_open ({state})"
        return validate_group(r, lease, self.limits)

    # -- batches ---------------------------------------------------------------------------
    def completed_ids(self, version: int | None = None) -> list[str]:
        return [g for g, c in self.completed.items() if version is None or c.result.version == version]

    def take(self, group_ids: list[str]) -> list[CompletedGroup]:
        """Hand completed groups to the trainer; each can be taken once."""
        out = []
        for gid in group_ids:
            if self.ledger.get(gid) != COMPLETED:
                raise ValueError(f"group {gid} is {self.ledger.get(gid)}, not completed")
            out.append(self.completed.pop(gid))
            self.ledger[gid] = TRAINED
        return out

    def drop(self, group_id: str, reason: str) -> None:
        self.completed.pop(group_id, None)
        self.ledger[group_id] = f"dropped:{reason}"

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for state in self.ledger.values():
            out[state] = out.get(state, 0) + 1
        return out
