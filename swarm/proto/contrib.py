"""What the learner credits a node with: a node asks, the learner answers for that node only.

``swarm-node status`` shows a volunteer what they gave as the learner sees it. The node sends a
:class:`ContribRequest` on :data:`CONTRIB`; the learner answers from its work ledger
(``learner/ledger.py``) with the line of the *asking* peer (its peer id comes from the
connection's Noise handshake, never from the message), so a peer learns nothing about any other.
A peer the learner has no line for gets ``known = False`` and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.proto import protocol_id
from swarm.proto.hello import MAX_NAME
from swarm.wire import Message, bounded, bounded_default

#: Node -> learner request, :class:`ContribReply` back.
CONTRIB = protocol_id("contrib")
#: Most tests named in ``verified`` / ``failed`` (the ledger knows four).
MAX_TESTS = 16


@dataclass
class ContribRequest(Message):
    KIND = "contrib_request"
    #: Nothing to say: the learner answers about the peer that asks.


@dataclass
class ContribReply(Message):
    KIND = "contrib_reply"
    #: Whether the learner has a line for the asking peer (False: every other field is empty).
    known: bool
    #: The learner's run (id and name) the figures belong to.
    run_id: str = bounded_default("", max_items=256)
    run_name: str = bounded_default("", max_items=256)
    #: The node's name as the operator sees it (its ``--name``, or the peer id's tail).
    name: str = bounded_default("", max_items=MAX_NAME)
    #: Groups pushed (accepted or not), rejected at the push, and trained on.
    groups_pushed: int = bounded_default(0, min=0)
    groups_rejected: int = bounded_default(0, min=0)
    groups_trained: int = bounded_default(0, min=0)
    #: Tokens the node reported generating in its accepted pushes.
    tokens_generated: int = bounded_default(0, min=0)
    #: Groups that passed each check (``replay``, ``stats``, ``validator``, ``skipped``) ...
    verified: dict[str, int] = bounded_default({}, max_items=MAX_TESTS, max_len=32)
    #: ... and groups that failed each.
    failed: dict[str, int] = bounded_default({}, max_items=MAX_TESTS, max_len=32)
    #: Why the learner stopped trusting the node ("" while trusted).
    untrusted: str = bounded_default("", max_items=512)
