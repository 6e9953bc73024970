"""Holds of the coordinator (verification after the ack, ``learner/verify_queue.py``): the
accepted groups of a push whose sampled groups are being re-scored are ``held`` under one hold
id; :meth:`Holds.release` makes them ``completed`` (trainable); a failed or impossible check
throws them away (``Coordinator._discard``). Mixed into :class:`learner.coordinator.Coordinator`,
whose ``ledger``, ``holds`` and ``held`` it keeps in step."""

from __future__ import annotations

from collections.abc import Iterator

from learner.ledger_states import COMPLETED, HELD


class Holds:
    """Hold, release and discard groups (state in ``ledger``, ``holds`` and ``held``)."""

    ledger: dict[str, str]
    #: Pushes waiting for verification: hold id -> its groups still ``held`` ...
    holds: dict[str, list[str]]
    #: ... and each held group's hold id.
    held: dict[str, str]
    #: Hold ids are drawn from the coordinator's id counter; ``_discard`` (its own) makes a
    #: held group pending again.
    _ids: Iterator[int]

    def hold(self, group_ids: list[str], into: str | None = None) -> str | None:
        """Keep the completed ``group_ids`` (one push's accepted groups) from training until
        :meth:`release`: under a new hold, or added to hold ``into`` while it still holds
        groups. Returns the hold id, or ``None`` if none of them is completed."""
        gids = [g for g in group_ids if self.ledger.get(g) == COMPLETED and g not in self.held]
        if not gids:
            return None
        hold_id = into if into is not None and self.holds.get(into) else f"H{next(self._ids)}"
        for gid in gids:
            self.ledger[gid] = HELD
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
            self.ledger[gid] = COMPLETED
        return gids

    def discard_hold(self, hold_id: str, reason: str) -> list[str]:
        """The hold's push could not be verified: its groups still held are thrown away
        (counted as dropped for ``reason``) and pending again at the front of the queue, for
        any peer. Returns them."""
        gids = self.holding(hold_id)
        for gid in reversed(gids):
            self._discard(gid, reason)
        return gids

    def _unhold(self, gid: str) -> None:
        hold_id = self.held.pop(gid, None)
        rest = self.holds.get(hold_id) if hold_id is not None else None
        if rest is not None:
            rest.remove(gid)
            if not rest:
                del self.holds[hold_id]
