"""Holds (verification after the ack, ``learner/verify_queue.py``): the accepted groups of a
push whose sampled groups are being re-scored are ``held`` under one hold id until the check
passes (:meth:`HoldBook.release`: completed, trainable) or fails (the coordinator throws them
away). A part of :class:`learner.coordinator.Coordinator`, which makes every hold id; the book
moves groups only through the coordinator's :class:`~learner.group_ledger.GroupLedger`."""

from __future__ import annotations

from typing import Callable

from learner.group_ledger import GroupEvent, GroupLedger, GroupState


class HoldBook:
    """Which groups are held under which hold; asks the ``ledger`` to move them between
    ``completed`` and ``held``."""

    def __init__(self, ledger: GroupLedger, new_id: Callable[[], str]) -> None:
        self.ledger = ledger
        self.new_id = new_id
        #: Pushes waiting for verification: hold id -> its groups still ``held`` ...
        self.holds: dict[str, list[str]] = {}
        #: ... and each held group's hold id.
        self.held: dict[str, str] = {}

    def hold(self, group_ids: list[str], into: str | None = None) -> str | None:
        """Keep the completed ``group_ids`` (one push's accepted groups) from training until
        :meth:`release`: under a new hold, or added to hold ``into`` while it still holds
        groups. Returns the hold id, or ``None`` if none of them is completed."""
        gids = [g for g in group_ids if self.ledger.get(g) is GroupState.COMPLETED and g not in self.held]
        if not gids:
            return None
        hold_id = into if into is not None and self.holds.get(into) else self.new_id()
        for gid in gids:
            self.ledger.apply(gid, GroupEvent.HOLD)
            self.held[gid] = hold_id
        self.holds.setdefault(hold_id, []).extend(gids)
        return hold_id

    def holding(self, hold_id: str) -> list[str]:
        """The groups still held under ``hold_id`` (none once released, revoked or dropped)."""
        return list(self.holds.get(hold_id, ()))

    def release(self, hold_id: str) -> list[str]:
        """The hold's push passed verification: its groups still held become completed
        (trainable). Returns them."""
        gids = self.holds.pop(hold_id, [])
        for gid in gids:
            del self.held[gid]
            self.ledger.apply(gid, GroupEvent.VERIFY)
        return gids

    def forget(self, gid: str) -> None:
        """``gid`` leaves its hold (its result is thrown away or dropped by the coordinator)."""
        hold_id = self.held.pop(gid, None)
        if hold_id is None:
            return
        rest = self.holds.get(hold_id)
        if rest is not None:
            rest.remove(gid)
            if not rest:
                del self.holds[hold_id]
