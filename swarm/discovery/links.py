"""Links, not nodes: which pairs of peers can hold a direct connection, and who must dial.

A NAT'd node cannot be dialled, but it can dial out; a connection, once open, carries streams
either way (a libp2p stream can be opened from either end of an existing connection). So what
decides whether a tree parent can feed a child, a chunk holder serve a fetcher or a pipeline
head drive a stage is the *link* between the two, not either node alone. A pair can link when:

- the second can be dialled (the learner's dial-back to it succeeded): the first dials it;
- else the first can be dialled: the second dials it (*connection reversal*; the learner, which
  both are connected to, tells the second to do so);
- else a hole punch between them succeeded (the per-pair record of the hole-punch attempts):
  the pair punches again (the learner tells one of them);
- else they reached each other by a plain dial of their own addresses (two nodes inside one
  network, e.g. behind the same router): one dials the other again;
- else no direct link exists (both behind NAT, no punch worked: a symmetric NAT on either side,
  typically).

The learner (peer id :data:`LEARNER`, the empty string, as in the broadcast plans) is connected
to every node already (each node dialled it), so it links with everyone, and it dials nobody.

The *role* of a node in a plan follows (:func:`relay_role`): a node that can be dialled, or
that punched a hole through its NAT with some peer, can be a relay (an interior node of the broadcast tree, a
chunk server, a pipeline stage another stage reaches); a node with no way in at all (not
dialable, and every hole punch failed or none was tried; links inside its own network do not
count) is a *leaf*, fed over connections it opens itself: a node feeding only dialable peers would use up the dialable parents that the
NAT'd nodes need, and would not be reachable for repair or as a holder. Every decision here is
a pure function of a :class:`Links` snapshot and carries its reason in plain words, for the
logs and the dashboard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

#: The learner's peer id in plans (it is connected to every node).
LEARNER = ""

#: How a pair connects (:attr:`Dial.how`).
DIRECT = "direct"
#: A node and the learner: the connection the node opened when it joined.
JOINED = "joined"
REVERSED = "reversed"
PUNCH = "punch"


def pair(a: str, b: str) -> frozenset[str]:
    """The unordered key of the pair ``a``, ``b``."""
    return frozenset((a, b))


@dataclass(frozen=True)
class Dial:
    """How the link ``sender`` -> ``receiver`` (data direction) is opened: ``dialer`` opens the
    connection to ``listener``; ``how`` is :data:`DIRECT` (the sender dials, as without NAT),
    :data:`JOINED` (a node and the learner: the node's own connection), :data:`REVERSED` (the
    receiver dials the sender) or :data:`PUNCH` (a hole punch)."""

    dialer: str
    listener: str
    how: str

    @property
    def needs_instruction(self) -> bool:
        """True when the learner must tell ``dialer`` to dial (a reversal or a punch): a sender
        dials its receivers by itself, and every node dialled the learner when it joined."""
        return self.how in (REVERSED, PUNCH)


@dataclass(frozen=True)
class Links:
    """What the learner knows about who can reach whom: a snapshot, built whole."""

    #: Peers the learner's dial-back reached (anyone can dial them). The learner is implied.
    dialable: frozenset[str] = frozenset()
    #: Pairs of NAT'd peers between which a hole punch (or a direct dial inside one network)
    #: made a direct connection.
    punched: frozenset[frozenset[str]] = frozenset()
    #: Pairs of NAT'd peers inside one network: a plain dial of the other's own address worked.
    lan: frozenset[frozenset[str]] = frozenset()
    #: Pairs whose hole punch failed, with the reason (for the role's explanation).
    failed: Mapping[frozenset[str], str] = field(default_factory=dict)
    #: Per peer, why it is not dialable (the dial-back's summary), for the explanations.
    why_not_dialable: Mapping[str, str] = field(default_factory=dict)

    def is_dialable(self, peer: str) -> bool:
        return peer == LEARNER or peer in self.dialable

    def dial(self, sender: str, receiver: str) -> Dial | None:
        """How ``sender`` can send to ``receiver`` over a direct connection (None: it cannot)."""
        if sender == receiver:
            return None
        if LEARNER in (sender, receiver):  # every node dialled the learner when it joined
            return Dial(receiver if sender == LEARNER else sender, LEARNER, JOINED)
        if self.is_dialable(receiver):
            return Dial(sender, receiver, DIRECT)
        if self.is_dialable(sender):
            return Dial(receiver, sender, REVERSED)
        if pair(sender, receiver) in self.punched:
            return Dial(receiver, sender, PUNCH)
        if pair(sender, receiver) in self.lan:
            return Dial(receiver, sender, REVERSED)
        return None

    def can_link(self, a: str, b: str) -> bool:
        """Whether :meth:`dial` finds a way (without building it: planners ask this often)."""
        if a == b:
            return False
        if self.is_dialable(a) or self.is_dialable(b):  # the learner too
            return True
        return pair(a, b) in self.punched or pair(a, b) in self.lan

    def punched_with(self, peer: str) -> list[str]:
        """The peers ``peer`` punched a hole with, sorted."""
        return sorted(p for pr in self.punched if peer in pr for p in pr if p != peer)

    def failed_with(self, peer: str) -> list[str]:
        return sorted(p for pr in self.failed if peer in pr for p in pr if p != peer)

    def lan_with(self, peer: str) -> list[str]:
        return sorted(p for pr in self.lan if peer in pr for p in pr if p != peer)


def links_from(dialable: Iterable[str], punch_results: Iterable[tuple[str, str, bool, str]] = (),
               why_not_dialable: Mapping[str, str] | None = None,
               lan: Iterable[tuple[str, str]] = ()) -> Links:
    """A :class:`Links` snapshot from dial-back results, hole-punch results
    ``(a, b, succeeded, reason)`` (the latest result of a pair wins: later items are later) and
    the pairs that reached each other inside one network (``lan``)."""
    last: dict[frozenset[str], tuple[bool, str]] = {}
    for a, b, ok, why in punch_results:
        if a != b:
            last[pair(a, b)] = (bool(ok), str(why))
    return Links(dialable=frozenset(dialable), punched=frozenset(k for k, (ok, _) in last.items() if ok),
                 failed={k: why for k, (ok, why) in last.items() if not ok},
                 why_not_dialable=dict(why_not_dialable or {}), lan=frozenset(pair(a, b) for a, b in lan if a != b))


@dataclass(frozen=True)
class Role:
    """Whether a node may relay (be an interior node, serve chunks, be reached as a stage), and why."""

    peer_id: str
    relay: bool
    #: ``"dialable"``, ``"punched"`` (NAT'd, reached by hole punches), ``"leaf"`` (no way in).
    kind: str
    why: str


def relay_role(links: Links, peer: str) -> Role:
    """The role ``peer`` can take, with the reason in plain words (module docstring)."""
    if links.is_dialable(peer):
        return Role(peer, True, "dialable", "dialable (the learner's dial-back reached it): any peer can connect to it")
    nat = "cannot be dialled (" + (links.why_not_dialable.get(peer) or "the learner's dial-back did not reach it") + ")"
    punched = links.punched_with(peer)
    if punched:
        return Role(peer, True, "punched",
                    f"{nat}; hole punch succeeded with {len(punched)} peer(s): it relays to them and to "
                    f"dialable peers, and dialable parents reach it by connection reversal")
    failed = links.failed_with(peer)
    lan = links.lan_with(peer)
    inside = f"; direct links only inside its own network ({len(lan)} peer(s))" if lan else ""
    if failed:
        return Role(peer, False, "leaf",
                    f"{nat}; every hole punch failed ({len(failed)} peer(s); an endpoint-dependent "
                    f"(symmetric) NAT likely){inside}: a leaf, fed by a dialable parent over a connection it "
                    f"opens itself")
    return Role(peer, False, "leaf",
                f"{nat}; no hole punch has succeeded yet{inside}: a leaf, fed by a dialable parent over a "
                f"connection it opens itself")


def roles(links: Links, peers: Iterable[str]) -> dict[str, Role]:
    return {p: relay_role(links, p) for p in peers}
