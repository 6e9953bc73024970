"""The learner's view of links between peers, and the connection reversals it asks for.

What the learner knows (``swarm.discovery.links``): which nodes its dial-back reached (the
dissemination members' ``reachable``), and per pair of nodes the last hole-punch result
reported to it (:meth:`LearnerLinks.record_punch`). :meth:`LearnerLinks.snapshot` turns that into
a :class:`~swarm.discovery.links.Links` for the planners. Before a plan's data flows, the
learner asks every node that must open a connection (a NAT'd child of a dialable parent, a NAT'd
pipeline stage of a dialable head) to dial (``LINK_DIAL``), all at once and under one deadline;
the outcome of each request is kept and logged. The roles the planners gave (relay or leaf, and
why) go into ``dissem.json`` and ``swarm.json``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Iterable, Mapping

import trio

from swarm.discovery.links import Dial, Links, links_from, relay_role
from swarm.errors import SwarmError
from swarm.proto.chunks import PeerRef
from swarm.proto.links import LINK_DIAL, LinkDial, LinkDialReply
from swarm.wire import WireError

log = logging.getLogger("echo_swarm.learner")

#: Hole-punch results kept (oldest dropped first).
KEEP_PUNCHES = 4096
#: Dial outcomes kept (pairs).
KEEP_DIALS = 4096


class LearnerLinks:
    def __init__(self, host, timeout_s: float) -> None:
        self.host = host
        self.timeout_s = timeout_s
        #: ``(a, b, succeeded, reason)`` of every hole punch reported, oldest first.
        self.punches: deque[tuple[str, str, bool, str]] = deque(maxlen=KEEP_PUNCHES)
        #: (dialer, listener) -> (connected, reason, wall time) of the last reversal asked for.
        self.dials: dict[tuple[str, str], tuple[bool, str, float]] = {}
        #: Peer id -> (kind, why) of the last role logged, so each change is logged once.
        self._roles: dict[str, tuple[str, str]] = {}

    def record_punch(self, a: str, b: str, ok: bool, why: str = "") -> None:
        """A hole punch between ``a`` and ``b`` (reported by either) succeeded or failed."""
        if a and b and a != b:
            self.punches.append((a, b, bool(ok), str(why)[:300]))

    def forget(self, peer: str) -> None:
        kept = [p for p in self.punches if peer not in p[:2]]
        self.punches.clear()
        self.punches.extend(kept)
        self._roles.pop(peer, None)

    def snapshot(self, dialable: Iterable[str], why_not: Mapping[str, str] | None = None) -> Links:
        return links_from(dialable, list(self.punches), why_not)

    def log_roles(self, links: Links, peers: Iterable[str]) -> None:
        """Log each node's role (relay or leaf, and why) when it changed."""
        for p in peers:
            role = relay_role(links, p)
            if self._roles.get(p) != (role.kind, role.why):
                self._roles[p] = (role.kind, role.why)
                (log.info if role.relay else log.warning)("links: %s may %s: %s", p[-6:],
                                                         "relay" if role.relay else "not relay (a leaf)", role.why)

    def summary(self, links: Links, peers: Iterable[str]) -> dict:
        """Per node: its role and why; per asked dial: the outcome (for ``dissem.json``/``swarm.json``)."""
        peers = sorted(peers)
        return {
            "roles": {p: {"kind": r.kind, "relay": r.relay, "why": r.why}
                      for p, r in ((p, relay_role(links, p)) for p in peers)},
            "punched": sorted(sorted(pr) for pr in links.punched),
            "punch_failed": sorted(sorted(pr) for pr in links.failed),
            "dials": [{"dialer": d, "listener": li, "connected": ok, "why": why}
                      for (d, li), (ok, why, _at) in sorted(self.dials.items())],
        }

    async def connect(self, dials: list[Dial], addrs: Mapping[str, list[str]], reason: str) -> dict[str, int]:
        """Ask each dialer of ``dials`` to open its connections (one request per dialer, all at
        once, under :attr:`timeout_s`); returns ``{"asked", "connected", "failed"}`` counts."""
        by_dialer: dict[str, list[Dial]] = {}
        for d in dials:
            by_dialer.setdefault(d.dialer, []).append(d)
        counts = {"asked": len(dials), "connected": 0, "failed": 0}
        if not by_dialer:
            return counts
        t0 = time.monotonic()
        async with trio.open_nursery() as nursery:
            for dialer, ds in by_dialer.items():
                nursery.start_soon(self._ask, dialer, ds, addrs, reason, counts)
        log.info("links: %s: asked %d node(s) for %d connection(s): %d made, %d failed (%.2f s)", reason,
                 len(by_dialer), len(dials), counts["connected"], counts["failed"], time.monotonic() - t0)
        return counts

    async def _ask(self, dialer: str, ds: list[Dial], addrs: Mapping[str, list[str]], reason: str,
                   counts: dict[str, int]) -> None:
        msg = LinkDial(peers=[PeerRef(d.listener, list(addrs.get(d.listener, []))[:16]) for d in ds],
                       how=[d.how for d in ds], reason=reason[:200])
        try:
            reply = await self.host.request(dialer, LINK_DIAL, msg, LinkDialReply, timeout=self.timeout_s + 2.0)
            made = set(reply.connected)
            errors = dict(zip(reply.failed, reply.errors))
        except (SwarmError, WireError) as e:
            made, errors = set(), {}
            log.warning("links: %s did not answer the dial request (%s)", dialer[-6:], e)
        now = time.time()
        for d in ds:
            ok = d.listener in made
            why = "" if ok else errors.get(d.listener, "no answer to the dial request")
            self.dials[(d.dialer, d.listener)] = (ok, why, now)
            counts["connected" if ok else "failed"] += 1
            if not ok:
                log.warning("links: %s could not connect to %s (%s): %s", dialer[-6:], d.listener[-6:], d.how, why)
        while len(self.dials) > KEEP_DIALS:
            self.dials.pop(next(iter(self.dials)))
