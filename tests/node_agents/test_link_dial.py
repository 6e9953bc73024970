"""Connection reversal on real libp2p hosts (127.0.0.1): the learner asks a node to dial a peer,
the node does and the peer then opens streams over that connection; only the learner's requests
are followed, and a request that breaks the schema is refused on arrival."""

from __future__ import annotations

import pytest
import trio

from learner.links import LearnerLinks
from node_agents.links import LinkDialer
from swarm.discovery.links import Dial
from swarm.errors import RemoteError
from swarm.host import open_host
from swarm.proto.chunks import PeerRef
from swarm.proto.links import LINK_DIAL, LinkDial, LinkDialReply
from swarm.wire import WireError


def test_link_dial_rejects_malformed_requests():
    with pytest.raises(WireError):
        LinkDial.from_wire({"peers": [{"peer_id": "a", "addrs": []}], "how": []})
    with pytest.raises(WireError):
        LinkDial.from_wire({"peers": [{"peer_id": "a", "addrs": []}], "how": ["teleport"]})
    msg = LinkDial.from_wire({"peers": [{"peer_id": "a", "addrs": []}], "how": ["reversed"], "extra": 1})
    assert msg.how == ["reversed"]


def test_node_dials_whom_the_learner_names_and_refuses_others(tmp_path):
    async def body():
        async with open_host(tmp_path / "l") as learner, open_host(tmp_path / "n") as node, \
                open_host(tmp_path / "p") as parent:
            await node.connect(learner.addrs[0])
            await parent.connect(learner.addrs[0])
            dialer = LinkDialer(node, learner.peer_id, timeout_s=5.0)
            dialer.register()
            links = LearnerLinks(learner, timeout_s=5.0)
            counts = await links.connect([Dial(node.peer_id, parent.peer_id, "reversed")],
                                         {parent.peer_id: parent.addrs}, "test")
            assert counts == {"asked": 1, "connected": 1, "failed": 0}
            assert links.dials[(node.peer_id, parent.peer_id)][0] is True
            # the parent reaches the node over the node's connection (it never dialled it)
            from libp2p.peer.id import ID

            assert parent.libp2p_host.get_network().get_connections(ID.from_base58(node.peer_id))
            # a peer that is not the learner is refused
            with pytest.raises(RemoteError):
                await parent.request(node.peer_id, LINK_DIAL,
                                     LinkDial(peers=[PeerRef(learner.peer_id, learner.addrs)], how=["reversed"]),
                                     LinkDialReply, timeout=10)
            # an address that answers nobody is a clean failure with the reason
            bogus = f"/ip4/127.0.0.1/tcp/9/p2p/{learner.peer_id[:-2]}zz"
            counts = await links.connect([Dial(node.peer_id, "12D3KooWnobody", "reversed")],
                                         {"12D3KooWnobody": [bogus]}, "test")
            assert counts["failed"] == 1 and links.dials[(node.peer_id, "12D3KooWnobody")][0] is False
            assert links.summary(links.snapshot([]), [node.peer_id])["dials"]

    async def main():
        with trio.fail_after(60):
            await body()

    trio.run(main)
