"""Self-certifying membership of a private run: tickets the learner signs, nodes check.

A private run (``network.private``) keeps its model, adapters and members' addresses to admitted
peers. The learner knows who is admitted; a node does not, so the learner hands each admitted peer
a :class:`~swarm.proto.membership.MembershipTicket`: its signature, with its libp2p host key, over
(:data:`DOMAIN`, run id, member peer id, expiry), valid for :data:`TICKET_TTL_S`. Anyone holding
the learner's peer id (every node pins it) can check a ticket offline:

- :func:`make_ticket` / :func:`ticket_refusal`: pure; the refusal checks sizes, the signer (the
  pinned learner, whose Ed25519 key its peer id embeds), the signature, that the member is the peer
  showing it, the run id and the expiry (wall clock; a clock that runs ahead ends tickets early);
- :class:`Membership`: a host's side. It holds the host's own ticket (:meth:`Membership.hold`: from
  the learner's hello ack or model manifest reply), which it shows with its chunk requests
  (:attr:`Membership.ticket`), and the peers that showed it a valid one, until their tickets expire
  (:meth:`Membership.present`). :meth:`Membership.allows` is what the node's chunk server and
  run-info ask: anyone while the host holds no ticket (an open run: nothing changes), else only the
  learner and peers with a valid ticket. Once the host held a ticket it stays private, also after
  its own ticket expires.
- :func:`membership_of`: the host's one :class:`Membership`, made on first use (like its chunk server).
"""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import msgpack

from swarm.budget import budget_for
from swarm.chunks.manifest import ManifestError, check_signature, signing_payload
from swarm.errors import FrameError
from swarm.framing import decode_body
from swarm.proto.membership import (MAX_PEER_ID_CHARS, MAX_RUN_ID_CHARS, MAX_SIGNATURE_BYTES, MAX_TICKET_BYTES,
                                    MembershipTicket)
from swarm.wire import WireError

log = logging.getLogger(__name__)

#: Signing domain of tickets (no other signed message's signature is valid for a ticket).
DOMAIN = b"echo-swarm/membership-ticket/1\x00"
#: How long a ticket the learner issues is valid, seconds (it issues a fresh one with every hello
#: ack and model manifest reply; a node asks again once half of it has passed, :data:`REFRESH_LEFT_S`).
TICKET_TTL_S = 3600.0
#: A node asks its learner for a fresh ticket once its own has less than this left, seconds.
REFRESH_LEFT_S = TICKET_TTL_S / 2
#: Seconds between a host's tries to renew its ticket (a learner that does not answer is not asked
#: at every adapter step).
RENEW_RETRY_S = 60.0
#: Most peers a host remembers as verified members (expired ones go first, then the oldest).
MAX_VERIFIED = 4096


def make_ticket(private_key: Any, signer: str, run_id: str, member: str, expires_at: float) -> MembershipTicket:
    """A ticket for ``member`` of ``run_id`` until ``expires_at`` (unix s), signed with the
    learner's libp2p ``private_key`` (``signer``: the learner's peer id)."""
    t = MembershipTicket(run_id=run_id, member=member, expires_at=int(expires_at), signer=signer)
    t.signature = private_key.sign(signing_payload(t, DOMAIN))
    return t


def pack_ticket(ticket: MembershipTicket | None) -> bytes:
    """``ticket`` as a chunk request carries it (empty: none)."""
    return msgpack.packb(ticket.to_wire(), use_bin_type=True) if ticket is not None else b""


def unpack_ticket(data: bytes) -> MembershipTicket | None:
    """The ticket packed in ``data`` (None: empty, oversize or malformed), decoded under the
    ticket's own budget."""
    if not data or len(data) > MAX_TICKET_BYTES:
        return None
    try:
        return MembershipTicket.from_wire(decode_body(0, data, max_size=MAX_TICKET_BYTES,
                                                      budget=budget_for(MembershipTicket)))
    except (FrameError, WireError):
        return None


def ticket_refusal(ticket: MembershipTicket, learner_peer_id: str, member: str, now: float,
                   run_id: str | None = None) -> str | None:
    """Why ``ticket`` does not make ``member`` (the peer showing it) a member of ``learner_peer_id``'s
    run ``run_id`` (None: any run of that learner) at wall time ``now``; None if it does."""
    if (len(ticket.run_id) > MAX_RUN_ID_CHARS or len(ticket.member) > MAX_PEER_ID_CHARS
            or len(ticket.signer) > MAX_PEER_ID_CHARS or len(ticket.signature) > MAX_SIGNATURE_BYTES):
        return "oversize ticket"
    if ticket.member != member:
        return "ticket of another peer"
    if run_id is not None and ticket.run_id != run_id:
        return f"ticket of another run ({ticket.run_id!r}, not {run_id!r})"
    if now >= ticket.expires_at:
        return "ticket expired"
    try:
        check_signature(ticket.signer, ticket.signature, signing_payload(ticket, DOMAIN), learner_peer_id, "ticket")
    except ManifestError as e:
        return str(e)
    return None


@dataclass(frozen=True)
class TicketIssuer:
    """The learner's side: signs tickets of its run (``private_key``: its host key, ``signer``: its
    peer id), each valid ``ttl_s`` from issue."""

    private_key: Any
    signer: str
    run_id: str
    ttl_s: float = TICKET_TTL_S

    def issue(self, member: str, now: float) -> MembershipTicket:
        return make_ticket(self.private_key, self.signer, self.run_id, member, now + self.ttl_s)


class Membership:
    """A host's tickets: its own and the peers that showed a valid one (see the module docstring)."""

    def __init__(self, peer_id: str, wall_clock: Callable[[], float] = time.time) -> None:
        self.peer_id = peer_id
        self.wall_clock = wall_clock
        #: The host's own ticket (None: none held: an open run, or no learner reply yet).
        self.own: MembershipTicket | None = None
        #: Whether the host's run is private (it held a ticket once).
        self.private = False
        #: Peer id -> (expiry, signature) of the valid ticket it showed.
        self.verified: dict[str, tuple[float, bytes]] = {}
        #: Wall time of the last renewal asked for (:meth:`renewing`).
        self.renew_asked_at = float("-inf")

    @property
    def learner(self) -> str:
        return self.own.signer if self.own is not None else ""

    @property
    def ticket(self) -> MembershipTicket | None:
        """The host's own ticket while valid (shown with its chunk requests), else None."""
        own = self.own
        return own if own is not None and own.expires_at > self.wall_clock() else None

    def hold(self, ticket: MembershipTicket | None, learner_peer_id: str) -> bool:
        """Keep ``ticket`` (from the learner ``learner_peer_id``) as the host's own if it is valid
        for this host; True if kept. None (an open run's learner issues none) changes nothing."""
        if ticket is None:
            return False
        why = ticket_refusal(ticket, learner_peer_id, self.peer_id, self.wall_clock())
        if why is not None:
            log.warning("membership: the learner's ticket is not valid for this host: %s", why)
            return False
        if self.own is None or self.own.run_id != ticket.run_id:
            self.verified.clear()  # members of another run mean nothing here
            log.info("membership: private run %s: serving chunks to its members only", ticket.run_id)
        self.own, self.private = ticket, True
        return True

    def due(self) -> bool:
        """Whether a private run's host should ask its learner for a fresh ticket now: half of its
        own is gone, and it did not ask in the last :data:`RENEW_RETRY_S`."""
        now = self.wall_clock()
        return (self.private and now - self.renew_asked_at >= RENEW_RETRY_S
                and (self.own is None or self.own.expires_at - now < REFRESH_LEFT_S))

    def renewing(self) -> None:
        """The host asks its learner for a fresh ticket now (:meth:`due` waits before the next try)."""
        self.renew_asked_at = self.wall_clock()

    def present(self, peer_id: str, ticket: MembershipTicket) -> bool:
        """``peer_id`` showed ``ticket``: remember it until the ticket expires if it is valid for
        this host's run; True if it is. A host without a ticket of its own ignores tickets."""
        own = self.own
        if own is None:
            return False
        known = self.verified.get(peer_id)
        if known is not None and known[1] == ticket.signature and known[0] > self.wall_clock():
            return True
        now = self.wall_clock()
        why = ticket_refusal(ticket, own.signer, peer_id, now, own.run_id)
        if why is not None:
            log.info("membership: %s showed a ticket that is not valid: %s", peer_id[-8:], why)
            return False
        self.verified.pop(peer_id, None)  # re-inserted last: dict order is the order shown
        self.verified[peer_id] = (float(ticket.expires_at), ticket.signature)
        if len(self.verified) > MAX_VERIFIED:
            gone = [p for p, (exp, _) in self.verified.items() if exp <= now] or list(self.verified)[:1]
            for p in gone:
                self.verified.pop(p, None)
        return True

    def allows(self, peer_id: str) -> bool:
        """Whether ``peer_id`` may read what this host holds of the run: anyone in an open run; in
        a private one the learner and the peers whose valid ticket this host saw."""
        if not self.private:
            return True
        if peer_id == self.learner:
            return True
        known = self.verified.get(peer_id)
        return known is not None and known[0] > self.wall_clock()


_memberships: "weakref.WeakKeyDictionary[object, Membership]" = weakref.WeakKeyDictionary()


def membership_of(host) -> Membership:
    """``host``'s membership, made on first use (one per host: its model fetch, adapter sync, chunk
    server and run-info share it)."""
    try:
        m = _memberships.get(host)
        if m is None:
            m = _memberships[host] = Membership(getattr(host, "peer_id", ""))
    except TypeError:  # a host that takes no weak reference (a test's fake): a fresh, open one
        return Membership(getattr(host, "peer_id", ""))
    return m
