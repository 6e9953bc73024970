"""Membership tickets (swarm/membership.py): what makes one valid, and a host's memory of members."""

from __future__ import annotations

import dataclasses

import pytest

from swarm.membership import (DOMAIN, MAX_VERIFIED, REFRESH_LEFT_S, RENEW_RETRY_S, TICKET_TTL_S, Membership, TicketIssuer,
                              make_ticket, membership_of, pack_ticket, ticket_refusal, unpack_ticket)
from swarm.proto.chunks import ChunkRequest
from swarm.proto.hello import HelloAck
from swarm.proto.membership import MAX_TICKET_BYTES, MembershipTicket
from swarm.wire import WireError

NOW = 1_000_000.0


def keypair():
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    kp = create_new_key_pair()
    return kp.private_key, ID.from_pubkey(kp.public_key).to_base58()


@pytest.fixture(scope="module")
def learner():
    return keypair()


@pytest.fixture(scope="module")
def member():
    return keypair()[1]


def test_a_ticket_is_valid_only_for_its_member_run_learner_and_time(learner, member):
    key, lid = learner
    t = make_ticket(key, lid, "run-1", member, NOW + 60)
    assert ticket_refusal(t, lid, member, NOW, "run-1") is None
    assert ticket_refusal(t, lid, member, NOW) is None  # any run of that learner
    assert ticket_refusal(t, lid, keypair()[1], NOW, "run-1") == "ticket of another peer"
    assert "another run" in ticket_refusal(t, lid, member, NOW, "run-2")
    assert ticket_refusal(t, lid, member, NOW + 60, "run-1") == "ticket expired"
    other_key, other_id = keypair()
    assert "not the learner" in ticket_refusal(t, other_id, member, NOW)  # another learner's run
    # forged: the learner's id as signer, another key's signature
    forged = make_ticket(other_key, lid, "run-1", member, NOW + 60)
    assert "bad signature" in ticket_refusal(forged, lid, member, NOW, "run-1")
    # altered after signing: a later expiry, another member
    assert "bad signature" in ticket_refusal(dataclasses.replace(t, expires_at=t.expires_at + 3600), lid, member, NOW)
    stolen = dataclasses.replace(t, member="someone")
    assert "bad signature" in ticket_refusal(stolen, lid, "someone", NOW)
    assert "unsigned" in ticket_refusal(dataclasses.replace(t, signature=b""), lid, member, NOW)
    # a signature of the same fields in another domain (e.g. a manifest's) is no ticket
    from swarm.chunks.manifest import signing_payload

    other_domain = dataclasses.replace(t, signature=key.sign(signing_payload(t, b"other-domain\x00")))
    assert DOMAIN != b"other-domain\x00" and "bad signature" in ticket_refusal(other_domain, lid, member, NOW)


def test_oversize_tickets_are_refused_and_do_not_decode(learner, member):
    key, lid = learner
    t = make_ticket(key, lid, "r" * 300, member, NOW + 60)
    assert ticket_refusal(t, lid, member, NOW) == "oversize ticket"
    with pytest.raises(WireError):
        MembershipTicket.from_wire(t.to_wire())
    big_sig = dataclasses.replace(make_ticket(key, lid, "run", member, NOW + 60), signature=b"x" * 129)
    assert ticket_refusal(big_sig, lid, member, NOW) == "oversize ticket"
    assert unpack_ticket(pack_ticket(big_sig)) is None  # does not decode
    with pytest.raises(WireError):  # a chunk request carries at most MAX_TICKET_BYTES of ticket
        ChunkRequest.from_wire(ChunkRequest(b"c" * 32, [0], b"x" * (MAX_TICKET_BYTES + 1)).to_wire())
    assert unpack_ticket(b"\xc1garbage") is None and unpack_ticket(b"") is None
    assert unpack_ticket(b"\x91" + b"\xc0") is None  # msgpack, but no ticket
    # the new fields are optional and bounded: old peers' messages decode
    assert ChunkRequest.from_wire({"content_id": b"c" * 32, "indices": [1]}).ticket == b""
    assert HelloAck.from_wire({"accepted": True, "run_id": "r", "model": "m", "current_version": 0}).ticket is None
    ok = make_ticket(key, lid, "run", member, NOW + 60)
    packed = ChunkRequest.from_wire(ChunkRequest(b"c" * 32, [0], pack_ticket(ok)).to_wire()).ticket
    assert len(packed) < 300 and unpack_ticket(packed) == ok
    ack = HelloAck(True, "run", "m", 0, ticket=ok)
    assert HelloAck.from_wire(ack.to_wire()).ticket == ok


def test_membership_serves_anyone_until_it_holds_a_ticket_then_members_only(learner, member):
    key, lid = learner
    clock = [NOW]
    issuer = TicketIssuer(key, lid, "run-1")  # TICKET_TTL_S
    me = Membership(member, wall_clock=lambda: clock[0])
    assert me.allows("stranger") and me.ticket is None and not me.due()  # an open run: unchanged
    assert not me.hold(None, lid)
    assert not me.hold(issuer.issue("another-node", NOW), lid)  # not ours: not kept
    assert not me.hold(issuer.issue(member, NOW), keypair()[1])  # not our learner's
    assert me.allows("stranger")
    assert me.hold(issuer.issue(member, NOW), lid)
    assert me.ticket is not None and me.private and me.learner == lid
    assert not me.allows("stranger") and me.allows(lid)
    peer_key, peer = keypair()
    assert not me.present(peer, make_ticket(peer_key, lid, "run-1", peer, NOW + 600))  # self-made: forged
    assert not me.present(peer, TicketIssuer(key, lid, "run-0").issue(peer, NOW))  # another run
    assert not me.present("stranger", issuer.issue(peer, NOW))  # someone else's ticket
    assert not me.allows(peer)
    assert me.present(peer, issuer.issue(peer, NOW)) and me.allows(peer)
    assert not me.due()
    clock[0] = NOW + TICKET_TTL_S - REFRESH_LEFT_S + 1  # half its life gone: ask for a fresh one
    assert me.due() and me.allows(peer)
    me.renewing()  # asked; the learner did not answer: not again before RENEW_RETRY_S
    assert not me.due()
    clock[0] += RENEW_RETRY_S
    assert me.due()
    clock[0] = NOW + TICKET_TTL_S  # both tickets expired: the peer is no member any more, the run stays private
    assert not me.allows(peer) and me.ticket is None and not me.allows("stranger") and me.due()
    assert me.allows(lid)


def test_a_host_remembers_a_bounded_number_of_members(learner, member):
    key, lid = learner
    issuer = TicketIssuer(key, lid, "run-1")
    me = Membership(member, wall_clock=lambda: NOW)
    me.hold(issuer.issue(member, NOW), lid)
    ticket = issuer.issue(member, NOW)
    for i in range(MAX_VERIFIED + 5):  # ids that verify cheaply: fake the verified entries' growth
        me.verified[f"p{i}"] = (NOW + 60, b"")
    peer = keypair()[1]
    assert me.present(peer, issuer.issue(peer, NOW))
    assert len(me.verified) <= MAX_VERIFIED + 5 and peer in me.verified and "p0" not in me.verified
    assert ticket.signer == lid


def test_membership_of_gives_one_per_host_and_copes_with_fakes():
    class Host:
        peer_id = "h"

    h = Host()
    assert membership_of(h) is membership_of(h)
    assert membership_of(object()).allows("anyone")  # no weak reference possible: a fresh, open one
