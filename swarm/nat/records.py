"""Hole-punch results per pair of peers: what a planner needs to know which NAT'd pairs can
hold a direct link (a pure record and a small book; no I/O)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

#: :attr:`PunchOutcome.how` values.
ALREADY = "already"  # a direct connection existed before any attempt
PUNCHED = "punched"  # a hole punch made one
FAILED = "failed"  # none after every attempt


@dataclass(frozen=True)
class PunchOutcome:
    """One :meth:`swarm.nat.service.NatService.punch` call between ``local`` and ``remote``."""

    local: str
    remote: str
    ok: bool
    how: str
    #: Attempts made (0 when a direct connection already existed).
    attempts: int
    #: Seconds from the call to the first direct connection (or to giving up).
    seconds: float
    #: Plain words: what happened (the last attempt's error on failure).
    reason: str = ""
    #: The remote address of the direct connection ("" if none).
    addr: str = ""
    at: float = field(default_factory=time.time)

    def as_result(self) -> tuple[str, str, bool, str]:
        """``(a, b, succeeded, reason)``, the form ``swarm.discovery.links.links_from`` takes."""
        return (self.local, self.remote, self.ok, self.reason)

    def to_json(self) -> dict:
        return asdict(self)


class PunchBook:
    """The latest outcome per unordered pair of peers, and every outcome in order (bounded)."""

    def __init__(self, keep: int = 1024) -> None:
        self.keep = keep
        self._latest: dict[frozenset[str], PunchOutcome] = {}
        self._history: list[PunchOutcome] = []

    def record(self, outcome: PunchOutcome) -> None:
        self._latest[frozenset((outcome.local, outcome.remote))] = outcome
        self._history.append(outcome)
        del self._history[:-self.keep]

    def latest(self, a: str, b: str) -> PunchOutcome | None:
        return self._latest.get(frozenset((a, b)))

    def can_link(self, a: str, b: str) -> bool:
        got = self.latest(a, b)
        return bool(got and got.ok)

    def results(self) -> list[tuple[str, str, bool, str]]:
        """Every recorded outcome as ``(a, b, succeeded, reason)``, oldest first."""
        return [o.as_result() for o in self._history]

    def history(self) -> list[PunchOutcome]:
        return list(self._history)
