"""The node's side of connection reversal: dial the peers the learner names (``LINK_DIAL``).

When a plan needs data to reach this node from a peer that cannot dial it (this node is behind
NAT), the learner asks this node to open the connection itself; the peer then opens its
streams over it. Only the learner's requests are followed (any other peer gets an error), and
only addresses that end in the named peer's id and are worth dialling from here
(``swarm.discovery.reach.candidate_addrs``) are dialled, each under a deadline.

With the node's :class:`swarm.nat.service.NatService` (``nat``), two more requests are served:
``reserve`` (take a slot at the named relay, the learner, so that other peers can open a
relayed connection to this node: the rendezvous of a hole punch) and ``punch`` (a hole punch to
the named peer through the circuit address the learner gives, after a plain dial of its
addresses, which works inside one network, e.g. two nodes behind the same router). Without it,
``punch`` is that plain dial only and ``reserve`` fails with the reason. A request naming no peer
carries the learner's word on this node's role (a relay, or a leaf and why); it is logged.
"""

from __future__ import annotations

import logging
import time
import trio

from swarm.discovery.reach import candidate_addrs, remote_ip_of
from swarm.errors import SwarmError
from swarm.proto.links import LINK_DIAL, LinkDial, LinkDialReply

log = logging.getLogger("echo_swarm.node")

#: Deadline (s) of the connection to one peer.
DIAL_TIMEOUT_S = 8.0
#: Deadline (s) of one hole punch (the plain dial first, then every attempt of a default
#: ``NatConfig`` with its backoff: ``swarm.nat.kinds.punch_budget_s``) or one reservation: under
#: the host's handler deadline (``HostConfig.handler_timeout_s``, 30 s), so the learner always
#: gets the node's answer.
PUNCH_TIMEOUT_S = 25.0
#: Deadline (s) of the plain dial before a hole punch (inside one network it takes milliseconds;
#: the punch needs the rest of the request's time).
LAN_DIAL_TIMEOUT_S = 2.0
CIRCUIT = "/p2p-circuit"


class LinkDialer:
    def __init__(self, host, learner_peer: str, nat=None, timeout_s: float = DIAL_TIMEOUT_S,
                 punch_timeout_s: float = PUNCH_TIMEOUT_S) -> None:
        self.host = host
        self.learner_peer = learner_peer
        #: The node's NAT service (``reserve(relay_addr)``, ``punch(peer, circuit_addr)``), or None.
        self.nat = nat
        self.timeout_s = timeout_s
        self.punch_timeout_s = punch_timeout_s
        #: Peer id -> (connected, seconds, reason), the last result of each dial asked for.
        self.results: dict[str, tuple[bool, float, str]] = {}

    def register(self) -> None:
        self.host.set_handler(LINK_DIAL, LinkDial, self.on_dial)

    async def on_dial(self, msg: LinkDial, peer_id: str) -> LinkDialReply:
        if peer_id != self.learner_peer:
            log.warning("links: refused a dial request from %s: only the learner asks for dials", peer_id[-8:])
            raise PermissionError("only this node's learner may ask it to dial")
        if not msg.peers:  # no dial: the learner tells this node its role (relay or leaf, and why)
            log.info("links: the learner says: %s", msg.reason)
            return LinkDialReply()
        t0 = time.monotonic()
        got: dict[str, str | None] = {}
        direct: set[str] = set()
        async with trio.open_nursery() as nursery:
            for ref, how in zip(msg.peers, msg.how):
                if ref.peer_id not in got and ref.peer_id != self.host.peer_id:
                    got[ref.peer_id] = "not tried"
                    nursery.start_soon(self._one, ref.peer_id, list(ref.addrs), how, got, direct)
        ok = [p for p, e in got.items() if e is None]
        bad = [p for p, e in got.items() if e is not None]
        plain = [p for p in ok if p in direct]
        log.info("links: %s: connected to %d peer(s)%s", msg.reason or "learner asked", len(ok),
                 "; failed: " + "; ".join(f"{p[-6:]}: {got[p]}" for p in bad) if bad else "")
        return LinkDialReply(connected=ok, failed=bad, errors=[str(got[p])[:300] for p in bad],
                             seconds=min(time.monotonic() - t0, 3600.0), direct=plain)

    async def _one(self, peer: str, addrs: list[str], how: str, got: dict[str, str | None], direct: set[str]) -> None:
        t0 = time.monotonic()
        limit = self.timeout_s if how == "reversed" else self.punch_timeout_s
        err: str | None = "no dialable address"
        with trio.move_on_after(limit) as scope:
            if how == "reserve":
                err = await self._reserve(peer, addrs)
            else:
                err = await self._dial(peer, addrs, self.timeout_s if how == "reversed" else LAN_DIAL_TIMEOUT_S)
                if err is None:
                    direct.add(peer)
                elif how == "punch":
                    err = await self._punch(peer, addrs, err)
        if scope.cancelled_caught:
            err = f"no connection within {limit} s"
        got[peer] = err
        self.results[peer] = (err is None, time.monotonic() - t0, err or "")

    async def _dial(self, peer: str, addrs: list[str], timeout_s: float) -> str | None:
        """A plain dial of ``peer``'s own addresses; None once a *direct* connection exists (a
        relayed one, left from a punch attempt, does not count: the dial would stop at it)."""
        if self.nat is not None and self.nat.relayed(peer) and self.nat.direct_addr(peer) is None:
            return "only a relayed connection"
        err: str | None = "no dialable address"
        plain = [a for a in addrs if CIRCUIT not in a]
        for addr in candidate_addrs(plain, peer, remote_ip_of(self.host, self.learner_peer)):
            try:
                with trio.fail_after(timeout_s):
                    await self.host.connect(addr)
            except (SwarmError, trio.TooSlowError) as e:
                err = f"{type(e).__name__}: {e}"
                continue
            if self.nat is None or self.nat.direct_addr(peer) is not None:
                return None
            err = "only a relayed connection"
        return err

    async def _punch(self, peer: str, addrs: list[str], dial_err: str) -> str | None:
        if self.nat is None:
            return f"{dial_err}; no hole punching on this node"
        circuit = next((a for a in addrs if CIRCUIT in a and a.endswith(f"/p2p/{peer}")), None)
        try:
            out = await self.nat.punch(peer, circuit)
        except Exception as e:  # a punch failure never takes the node down
            return f"hole punch: {type(e).__name__}: {e}"
        return None if out.ok else f"hole punch failed: {out.reason}"

    async def _reserve(self, relay: str, addrs: list[str]) -> str | None:
        if self.nat is None:
            return "no relay client on this node"
        err = "no relay address"
        for addr in [a for a in addrs if CIRCUIT not in a and a.endswith(f"/p2p/{relay}")]:
            try:
                await self.nat.reserve(addr)
                return None
            except Exception as e:
                err = f"{type(e).__name__}: {e}"
        return err
