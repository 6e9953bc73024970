"""Membership tickets: the learner's signed word that a peer is a member of its run.

A private run's learner (``network.private``) gives one to each admitted peer (in its
``HelloAck`` and its model manifest reply); a node shows it with its chunk requests to other
nodes, which serve a private run's chunks only to peers with a valid one (``swarm.membership``).
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.wire import Message, bounded, bounded_default

#: Longest run id a ticket names (the ``HelloAck.run_id`` bound).
MAX_RUN_ID_CHARS = 256
#: Longest peer id (base58) a ticket names.
MAX_PEER_ID_CHARS = 128
#: Longest signature (an Ed25519 one is 64 bytes).
MAX_SIGNATURE_BYTES = 128
#: Longest packed ticket (msgpack of its wire dict, as a chunk request carries it; a real one is
#: about 200 bytes).
MAX_TICKET_BYTES = 1024


@dataclass
class MembershipTicket(Message):
    KIND = "membership_ticket"
    #: The run the member belongs to (the learner's announced run id).
    run_id: str = bounded(max_items=MAX_RUN_ID_CHARS)
    #: Peer id of the member: only that peer may show the ticket.
    member: str = bounded(max_items=MAX_PEER_ID_CHARS)
    #: Wall-clock unix seconds after which the ticket is void.
    expires_at: int = bounded(min=0)
    #: Peer id of the learner that signed it.
    signer: str = bounded(max_items=MAX_PEER_ID_CHARS)
    #: Ed25519 signature by the learner's host key (``swarm.membership.signing_payload``).
    signature: bytes = bounded_default(b"", max_items=MAX_SIGNATURE_BYTES)
