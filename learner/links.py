"""The learner's view of links between peers, and the connection reversals it asks for.

What the learner knows (``swarm.discovery.links``): which nodes its dial-back reached (the
dissemination members' ``reachable``), and per pair of nodes the last hole-punch result
reported to it (:meth:`LearnerLinks.record_punch`). :meth:`LearnerLinks.snapshot` turns that into
a :class:`~swarm.discovery.links.Links` for the planners. Before a plan's data flows, the
learner asks every node that must open a connection (a NAT'd child of a dialable parent, a NAT'd
pipeline stage of a dialable head) to dial (``LINK_DIAL``), all at once and under one deadline;
the outcome of each request is kept and logged. The roles the planners gave (relay or leaf, and
why) go into ``dissem.json`` and ``swarm.json``, and each node hears its own in a few words
(:func:`role_note`) in that round of requests, so that its log says whether it relays and why.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Set as AbstractSet
from typing import Iterable, Mapping

import trio

from swarm.discovery.links import PUNCH, Dial, Links, Role, links_from, relay_role
from swarm.errors import SwarmError
from swarm.proto.chunks import PeerRef
from swarm.proto.links import LINK_DIAL, LinkDial, LinkDialReply
from swarm.wire import WireError

log = logging.getLogger("echo_swarm.learner")

#: Hole-punch results kept (oldest dropped first).
KEEP_PUNCHES = 4096
#: Dial outcomes kept (pairs).
KEEP_DIALS = 4096
#: Most peers a newly registered NAT'd node is asked to hole-punch with.
MAX_PUNCH_PEERS = 6
#: Hole punches under way at once, swarm-wide: each goes through the learner's relay, and a punch
#: that waits for a busy machine misses its window.
PUNCH_CONCURRENCY = 4
#: Passes of a punch round: pairs whose punch failed are tried again (a busy machine misses a
#: punch's timing often; the node's handler deadline allows one attempt per request).
PUNCH_PASSES = 3
#: A node with this many punched peers is not retried (it can relay already).
ENOUGH_PUNCHED = 2
#: Deadline (s) of telling a node its role when it has nothing to dial (the push waits for it).
TELL_TIMEOUT_S = 3.0
CIRCUIT = "/p2p-circuit"


def role_note(links: Links, peer: str, role: Role) -> str:
    """``peer``'s role in a few words, for the node's own log (a dial request's reason is
    short; the full reason is in the learner's log and reports)."""
    if role.relay:
        return f"this node is a relay ({role.kind})"
    failed, lan = len(links.failed_with(peer)), len(links.lan_with(peer))
    why = (f"every hole punch failed ({failed} peer(s), symmetric NAT likely)" if failed
           else "no hole punch has succeeded yet")
    inside = f", {lan} link(s) inside its network" if lan else ""
    return f"this node is a leaf: cannot be dialled, {why}{inside}; fed over connections it opens"


class LearnerLinks:
    def __init__(self, host, timeout_s: float, punch_timeout_s: float = 35.0) -> None:
        self.host = host
        self.timeout_s = timeout_s
        #: Deadline (s) of a request that reserves or hole-punches (retries and backoff included).
        self.punch_timeout_s = punch_timeout_s
        #: Punch rounds under way (:meth:`punch_round`); :meth:`wait_idle` waits for none.
        self.busy = 0
        #: Pairs of NAT'd nodes that reached each other by a plain dial (inside one network).
        self.lan: set[frozenset[str]] = set()
        #: Pairs a punch round is trying now (another round does not try them again meanwhile).
        self._trying: set[frozenset[str]] = set()
        self._punch_slots = trio.CapacityLimiter(PUNCH_CONCURRENCY)
        self._idle = trio.Event()
        self._idle.set()
        #: ``(a, b, succeeded, reason)`` of every hole punch reported, oldest first.
        self.punches: deque[tuple[str, str, bool, str]] = deque(maxlen=KEEP_PUNCHES)
        #: (dialer, listener) -> (connected, reason, wall time) of the last reversal asked for.
        self.dials: dict[tuple[str, str], tuple[bool, str, float]] = {}
        #: Peer id -> (kind, why) of the last role logged, so each change is logged once.
        self._roles: dict[str, tuple[str, str]] = {}
        #: Peer id -> its role in a few words (:func:`role_note`), told to the node in the dial
        #: requests it gets, so that its own log says whether it relays and why.
        self.notes: dict[str, str] = {}
        #: Peer id -> the note it last acknowledged (each change is told once).
        self._told: dict[str, str] = {}

    def record_punch(self, a: str, b: str, ok: bool, why: str = "") -> None:
        """A hole punch between ``a`` and ``b`` (reported by either) succeeded or failed."""
        if a and b and a != b:
            self.punches.append((a, b, bool(ok), str(why)[:300]))

    def forget(self, peer: str) -> None:
        self.lan = {p for p in self.lan if peer not in p}
        kept = [p for p in self.punches if peer not in p[:2]]
        self.punches.clear()
        self.punches.extend(kept)
        self._roles.pop(peer, None)
        self.notes.pop(peer, None)
        self._told.pop(peer, None)

    def snapshot(self, dialable: Iterable[str], why_not: Mapping[str, str] | None = None) -> Links:
        return links_from(dialable, list(self.punches), why_not, [(a, b) for a, b in map(sorted, self.lan)])

    def log_roles(self, links: Links, peers: Iterable[str]) -> None:
        """Log each node's role (relay or leaf, and why) when it changed."""
        for p in peers:
            role = relay_role(links, p)
            self.notes[p] = role_note(links, p, role)
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
            "lan": sorted(sorted(pr) for pr in links.lan),
            "punch_failed": sorted(sorted(pr) for pr in links.failed),
            "dials": [{"dialer": d, "listener": li, "connected": ok, "why": why}
                      for (d, li), (ok, why, _at) in sorted(self.dials.items())],
        }

    async def connect(self, dials: list[Dial], addrs: Mapping[str, list[str]], reason: str) -> dict[str, int]:
        """Ask each dialer of ``dials`` to open its connections (one request per dialer, all at
        once, under :attr:`timeout_s`); returns ``{"asked", "connected", "failed"}`` counts. A
        node whose role changed since it was last told hears it in the same round: in its
        request's reason, or in a request naming no peer."""
        by_dialer: dict[str, list[Dial]] = {}
        for d in dials:
            by_dialer.setdefault(d.dialer, []).append(d)
        counts = {"asked": len(dials), "connected": 0, "failed": 0}
        t0 = time.monotonic()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.tell_roles, reason, set(by_dialer))
            for dialer, ds in by_dialer.items():
                nursery.start_soon(self._ask, dialer, ds, addrs, reason, counts)
        if not by_dialer:
            return counts
        log.info("links: %s: asked %d node(s) for %d connection(s): %d made, %d failed (%.2f s)", reason,
                 len(by_dialer), len(dials), counts["connected"], counts["failed"], time.monotonic() - t0)
        return counts

    def circuit_addrs(self, via_peer: str, target: str) -> list[str]:
        """Addresses of ``target`` through the learner's relay, as ``via_peer`` can dial the learner."""
        return [f"{a}{CIRCUIT}/p2p/{target}" for a in self.host.advertised_addrs(via_peer)[:2]]

    async def punch_round(self, peer: str, others: list[str], addrs: Mapping[str, list[str]]) -> None:
        """A NAT'd ``peer`` just registered: have it reserve a slot at the learner's relay (so that
        others can punch to it), then hole-punch to up to :data:`MAX_PUNCH_PEERS` of ``others``
        (NAT'd members, untried pairs first); every outcome is recorded as a punch result."""
        self.busy += 1
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        try:
            me = PeerRef(self.host.peer_id, self.host.advertised_addrs(peer)[:16])
            await self._request(peer, LinkDial(peers=[me], how=["reserve"], reason="relay reservation"),
                                self.punch_timeout_s)
            tried = {frozenset(p[:2]) for p in self.punches}
            order = sorted((o for o in others if frozenset((peer, o)) not in self._trying),
                           key=lambda o: (frozenset((peer, o)) in tried, o))[:MAX_PUNCH_PEERS]
            if not order:
                return
            pairs = {frozenset((peer, o)) for o in order}
            self._trying |= pairs
            counts = {"asked": len(order), "connected": 0, "failed": 0}
            todo = list(order)
            try:
                for attempt in range(PUNCH_PASSES):
                    if attempt:
                        await trio.sleep(2.0 * attempt)
                    counts["failed"] = 0
                    async with trio.open_nursery() as nursery:
                        for o in todo:  # one pair per request, a few at a time swarm-wide
                            nursery.start_soon(self._punch_one, peer, o, addrs, counts)
                    done = self.snapshot([])
                    todo = [o for o in todo if not done.can_link(peer, o)]
                    if not todo or len(done.punched_with(peer)) >= ENOUGH_PUNCHED:
                        break
            finally:
                self._trying -= pairs
            log.info("links: %s connected to %d of %d NAT'd peer(s) (hole punch or same network)", peer[-6:],
                     counts["connected"], len(order))
        finally:
            self.busy -= 1
            if self.busy == 0:
                self._idle.set()

    async def _punch_one(self, peer: str, other: str, addrs: Mapping[str, list[str]], counts: dict[str, int]) -> None:
        async with self._punch_slots:
            await self._ask(peer, [Dial(peer, other, PUNCH)], addrs, "hole punch round", counts)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no punch round is under way; False on timeout."""
        with trio.move_on_after(timeout_s):
            await self._idle.wait()
            return True
        return False

    async def tell_roles(self, reason: str, skip: AbstractSet[str] = frozenset()) -> None:
        """Tell each node (but ``skip``) whose role changed since it was last told: a dial request
        naming no peer, whose reason the node logs; once per change, all at once, under
        :data:`TELL_TIMEOUT_S` (a silent node delays no later push)."""
        tell = {p: n for p, n in self.notes.items() if self._told.get(p) != n and p not in skip}
        self._told.update(tell)
        timeout = min(self.timeout_s, TELL_TIMEOUT_S)
        async with trio.open_nursery() as nursery:
            for p, note in tell.items():
                nursery.start_soon(self._request, p, LinkDial(reason=f"{reason}; {note}"[:200]), timeout)

    async def _request(self, peer: str, msg: LinkDial, timeout: float) -> LinkDialReply | None:
        try:
            return await self.host.request(peer, LINK_DIAL, msg, LinkDialReply, timeout=timeout)
        except (SwarmError, WireError) as e:
            log.warning("links: %s did not answer the %s request (%s)", peer[-6:], msg.reason, e)
            return None

    async def _ask(self, dialer: str, ds: list[Dial], addrs: Mapping[str, list[str]], reason: str,
                   counts: dict[str, int]) -> None:
        refs = [PeerRef(d.listener, (list(addrs.get(d.listener, []))[:14]
                                     + (self.circuit_addrs(dialer, d.listener) if d.how == PUNCH else []))[:16])
                for d in ds]
        note = self.notes.get(dialer)
        msg = LinkDial(peers=refs, how=[d.how for d in ds], reason=(f"{reason}; {note}" if note else reason)[:200])
        timeout = self.punch_timeout_s if any(d.how == PUNCH for d in ds) else self.timeout_s + 2.0
        answered = True
        try:
            reply = await self.host.request(dialer, LINK_DIAL, msg, LinkDialReply, timeout=timeout)
            made = set(reply.connected)
            errors = dict(zip(reply.failed, reply.errors))
            plain = set(reply.direct) & made
            if note:
                self._told[dialer] = note
        except (SwarmError, WireError) as e:
            made, errors, answered, plain = set(), {}, False, set()
            log.warning("links: %s did not answer the dial request (%s)", dialer[-6:], e)
        now = time.time()
        for d in ds:
            ok = d.listener in made
            why = "" if ok else errors.get(d.listener, "no answer to the dial request")
            self.dials[(d.dialer, d.listener)] = (ok, why, now)
            counts["connected" if ok else "failed"] += 1
            if d.how == PUNCH and d.listener in plain:  # inside one network: no punch through the NAT
                self.lan.add(frozenset((d.dialer, d.listener)))
            elif d.how == PUNCH and answered:  # no answer says nothing about the pair
                self.record_punch(d.dialer, d.listener, ok, why)
            if not ok:
                log.warning("links: %s could not connect to %s (%s): %s", dialer[-6:], d.listener[-6:], d.how, why)
        while len(self.dials) > KEEP_DIALS:
            self.dials.pop(next(iter(self.dials)))
