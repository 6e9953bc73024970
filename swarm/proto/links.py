"""Connection reversal: the learner asks a node to open a connection to a peer that cannot
dial it (``LINK_DIAL``), one request and one reply.

A NAT'd node can be dialled by nobody, but it can dial out, and a connection once open carries
streams both ways. When a plan needs data to flow to such a node (a tree parent feeding it, a
pipeline head driving it as a stage), the learner, which both peers are connected to, sends the
node a :class:`LinkDial` naming the peers to connect to; the node dials each (or hole-punches,
``how = "punch"``; or reserves a slot at a relay, ``how = "reserve"``) and answers which
connections it holds. The sender then opens its streams
over that connection. A node takes these requests from its learner only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swarm.proto import protocol_id
from swarm.proto.chunks import PeerRef
from swarm.wire import Message, WireError, bounded_default

LINK_DIAL = protocol_id("link-dial")

#: Most peers one request names.
MAX_LINK_PEERS = 256
#: The ways a node may be asked to connect (``swarm.discovery.links``): dial the peer's
#: addresses, hole-punch to it (through the circuit address among them), or reserve a slot at
#: the peer as a circuit relay (so that others can reach this node through it).
HOWS = ("reversed", "punch", "reserve")


@dataclass
class LinkDial(Message):
    """Open (or keep) a direct connection to each of ``peers``."""

    KIND = "link_dial"
    peers: list[PeerRef] = field(default_factory=list, metadata={"max_items": MAX_LINK_PEERS})
    #: Per peer: one of :data:`HOWS`.
    how: list[str] = bounded_default([], max_items=MAX_LINK_PEERS, max_len=16)
    #: Why the learner asks (``"dissem v7"``, ``"pipeline p3"``), for the node's log.
    reason: str = bounded_default("", max_items=200)

    def __post_init__(self) -> None:
        if len(self.how) != len(self.peers):
            raise WireError(f"link_dial: {len(self.how)} 'how' values for {len(self.peers)} peers")
        bad = [h for h in self.how if h not in HOWS]
        if bad:
            raise WireError(f"link_dial.how must be one of {HOWS}, got {bad[:3]}")


@dataclass
class LinkDialReply(Message):
    KIND = "link_dial_reply"
    #: Peers the node now holds a connection to.
    connected: list[str] = bounded_default([], max_items=MAX_LINK_PEERS, max_len=128)
    #: Peers it could not connect to, each with the reason (same order).
    failed: list[str] = bounded_default([], max_items=MAX_LINK_PEERS, max_len=128)
    errors: list[str] = bounded_default([], max_items=MAX_LINK_PEERS, max_len=300)
    #: Of ``connected``: the peers reached by a plain dial of their own addresses, without a hole
    #: punch (for a peer that cannot be dialled from outside: both inside one network).
    direct: list[str] = bounded_default([], max_items=MAX_LINK_PEERS, max_len=128)
    #: Seconds the dials took in all.
    seconds: float = bounded_default(0.0, min=0.0, max=3600.0)
