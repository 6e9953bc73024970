"""The node's side of connection reversal: dial the peers the learner names (``LINK_DIAL``).

When a plan needs data to reach this node from a peer that cannot dial it (this node is behind
NAT), the learner asks this node to open the connection itself; the peer then opens its
streams over it. Only the learner's requests are followed (any other peer gets an error), and
only addresses that end in the named peer's id and are worth dialling from here
(``swarm.discovery.reach.candidate_addrs``) are dialled, each under a deadline. ``punch``
requests go to a hole-punch function when the node has one, else to a plain dial (which works
inside one network, e.g. two nodes behind the same router).
"""

from __future__ import annotations

import logging
import time
from typing import Awaitable, Callable

import trio

from swarm.discovery.reach import candidate_addrs, remote_ip_of
from swarm.errors import SwarmError
from swarm.proto.links import LINK_DIAL, LinkDial, LinkDialReply

log = logging.getLogger("echo_swarm.node")

#: Deadline (s) of the connection to one peer.
DIAL_TIMEOUT_S = 8.0

#: ``punch(peer_id, addrs)``: hole-punch to a peer; True when a direct connection results.
Punch = Callable[[str, list[str]], Awaitable[bool]]


class LinkDialer:
    def __init__(self, host, learner_peer: str, punch: Punch | None = None,
                 timeout_s: float = DIAL_TIMEOUT_S) -> None:
        self.host = host
        self.learner_peer = learner_peer
        self.punch = punch
        self.timeout_s = timeout_s
        #: Peer id -> (connected, seconds, reason), the last result of each dial asked for.
        self.results: dict[str, tuple[bool, float, str]] = {}

    def register(self) -> None:
        self.host.set_handler(LINK_DIAL, LinkDial, self.on_dial)

    async def on_dial(self, msg: LinkDial, peer_id: str) -> LinkDialReply:
        if peer_id != self.learner_peer:
            log.warning("links: refused a dial request from %s: only the learner asks for dials", peer_id[-8:])
            raise PermissionError("only this node's learner may ask it to dial")
        t0 = time.monotonic()
        got: dict[str, str | None] = {}
        async with trio.open_nursery() as nursery:
            for ref, how in zip(msg.peers, msg.how):
                if ref.peer_id not in got and ref.peer_id != self.host.peer_id:
                    got[ref.peer_id] = "not tried"
                    nursery.start_soon(self._one, ref.peer_id, list(ref.addrs), how, got)
        ok = [p for p, e in got.items() if e is None]
        bad = [p for p, e in got.items() if e is not None]
        log.info("links: %s: connected to %d peer(s)%s", msg.reason or "learner asked", len(ok),
                 "; failed: " + "; ".join(f"{p[-6:]}: {got[p]}" for p in bad) if bad else "")
        return LinkDialReply(connected=ok, failed=bad, errors=[str(got[p])[:300] for p in bad],
                             seconds=min(time.monotonic() - t0, 3600.0))

    async def _one(self, peer: str, addrs: list[str], how: str, got: dict[str, str | None]) -> None:
        t0 = time.monotonic()
        cands = candidate_addrs(addrs, peer, remote_ip_of(self.host, self.learner_peer))
        err: str | None = "no dialable address"
        with trio.move_on_after(self.timeout_s) as scope:
            if how == "punch" and self.punch is not None:
                try:
                    err = None if await self.punch(peer, cands) else "hole punch failed"
                except Exception as e:  # a punch failure never takes the node down
                    err = f"hole punch: {type(e).__name__}: {e}"
            else:
                for addr in cands:
                    try:
                        await self.host.connect(addr)
                        err = None
                        break
                    except SwarmError as e:
                        err = f"{type(e).__name__}: {e}"
        if scope.cancelled_caught:
            err = f"no connection within {self.timeout_s} s"
        got[peer] = err
        self.results[peer] = (err is None, time.monotonic() - t0, err or "")
