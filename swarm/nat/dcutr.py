"""py-libp2p's DCUtR service (``libp2p.relay.circuit_v2.dcutr``) as the project drives it.

What we found running it on echo-swarm's hosts (Ed25519, Noise, Yamux) between emulated hosts
(``bench/netns.py``), py-libp2p 0.8.1:

- The exchange itself works on our stack: CONNECT, CONNECT, SYNC over the relayed connection,
  then both sides dial from their listening port (TCP simultaneous open) and upgrade with fixed
  Noise roles (``Swarm.dial_addr_as_responder``; both sides upgrading as initiator fails with
  ``InvalidTag``). Public <-> NAT'd and NAT'd <-> NAT'd (two endpoint-independent routers)
  both give a direct connection.
- Hole punches between two NAT'd hosts failed every time in the emulation while its routers
  answered an unsolicited SYN with a reset: the peer's early SYN drew a reset that aborted its
  half of the simultaneous open ("Connection refused"). Real home routers drop such packets;
  the emulated ones now do too (``bench/nat_rules.py``). That, not the Noise/Yamux stack, was
  the failure between NAT'd peers.
- Every upstream DCUtR service also drives hole punches by itself: every 2 s it starts one
  towards each peer it holds only a relayed connection to, at most 3 per peer for the life of
  the connection. Two services doing that at once run two sessions with opposite roles, and a
  responder that already holds a direct connection closes the stream without a reply, which
  the initiator reports as "Error in DCUtR protocol" although a direct connection exists. The
  project decides who punches (the learner tells one side, ``swarm.discovery.links``), so
  :class:`PunchingDCUtR` turns the self-driving loop off and makes each explicit call one fresh
  attempt with its own budget; retries and backoff are :class:`swarm.nat.service.NatService`'s.

- Every upstream attempt first dials the peer's known direct addresses (the spec's
  "unilateral upgrade") and waits up to its dial timeout for them. A punch is only ever asked
  for a peer that could not be dialled (the learner asks for punches between NAT'd nodes, after
  the node's own plain dial of the peer's addresses, ``node_agents/links.py``; the doctor
  punches after its dial-back failed), and such a peer's router drops the unsolicited SYN, so
  that dial waited out its whole timeout (5 s) before every exchange: a punch between two NAT'd
  nodes took 5.3 s instead of about 0.4 s. The wrapper skips it.

``tests/swarm/test_nat_upstream.py`` pins the upstream behaviour this wrapper overrides, so a
py-libp2p release that changes it shows up as a failing test.
"""

from __future__ import annotations

from typing import Any

import trio
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol


class PunchingDCUtR(DCUtRProtocol):
    """Upstream DCUtR that punches only when asked (:meth:`punch_once`); it still answers every
    peer's DCUtR stream (the responder side)."""

    async def _auto_drive_loop(self) -> None:  # upstream: punch every relayed peer every 2 s
        await trio.sleep_forever()

    async def _try_unilateral_upgrade(self, peer_id: Any) -> bool:  # upstream: dial known addrs first
        return False  # the caller dialled already (see the module)

    async def punch_once(self, peer_id: Any) -> bool:
        """One DCUtR attempt towards ``peer_id`` (a libp2p ``ID``): the CONNECT/SYNC exchange
        over the relayed connection and up to 3 rounds of simultaneous dials (the caller bounds
        it). True when a direct connection exists afterwards."""
        self._hole_punch_attempts.pop(peer_id, None)  # our retries are not upstream's budget
        self._direct_connections.discard(peer_id)  # re-checked against the live connections
        await self.initiate_hole_punch(peer_id)
        return await self._verify_direct_connection(peer_id)
