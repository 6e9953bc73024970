"""The NAT checks other peers ask of a host (``swarm.proto.nat``), and their client side: at which
address a peer sees our direct connections (observe), whether a fresh host can dial us back at our
addresses (dial-back), and the bandwidth to a peer. The costly ones are rate-limited per asker and
for everyone (``NatConfig.probes_per_min*``). Also the facts about a host's connections that the
checks and the hole punching (:mod:`swarm.nat.service`) read."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from swarm.addrs import connection_remote_ip, is_loopback, split_peer_id
from swarm.errors import SwarmError
from swarm.nat.config import NatConfig
from swarm.nat.kinds import admit_probe
from swarm.proto.nat import (
    MAX_ADDRS,
    NAT_BANDWIDTH,
    NAT_DIALBACK,
    NAT_OBSERVE,
    BandwidthReply,
    BandwidthRequest,
    DialBackReply,
    DialBackRequest,
    Observed,
    ObserveRequest,
)

if TYPE_CHECKING:
    from swarm.host import SwarmHost

# Records keep the logger name of :mod:`swarm.nat.service`, whose part of the NAT service this is.
log = logging.getLogger("swarm.nat.service")

CIRCUIT = "/p2p-circuit"


def conn_addrs(conn: Any) -> list[str]:
    try:
        return [str(a) for a in conn.get_transport_addresses()]
    except Exception:
        return []


def is_direct(conn: Any) -> bool:
    """A connection that does not go through a relay. Its type (py-libp2p records it from the
    raw connection up) decides: its transport addresses cannot, since a connection with none
    recorded reports the peer's peerstore addresses instead, a relay's among them."""
    try:
        kind = conn.get_connection_type()
    except Exception:
        kind = None
    value = getattr(kind, "value", kind)
    if value in ("direct", "relayed"):
        return value == "direct"
    addrs = conn_addrs(conn)
    return bool(addrs) and not any(CIRCUIT in a for a in addrs)


def remote_ip_port(conn: Any) -> tuple[str, int] | None:
    try:
        remote = conn.muxed_conn.get_remote_address()
    except Exception:
        return None
    if isinstance(remote, tuple) and len(remote) >= 2:
        return str(remote[0]), int(remote[1])
    return None


def conns_of(host: SwarmHost, peer_id: str) -> list[Any]:
    """The host's connections to ``peer_id`` (py-libp2p's)."""
    from libp2p.peer.id import ID

    try:
        return list(host.libp2p_host.get_network().get_connections(ID.from_base58(peer_id)))
    except Exception:
        return []


def direct_addr(host: SwarmHost, peer_id: str) -> str | None:
    """The remote address of a direct (not relayed) connection to ``peer_id``, if any."""
    for c in conns_of(host, peer_id):
        if is_direct(c):
            ipp = remote_ip_port(c)
            if ipp:
                return f"/{'ip6' if ':' in ipp[0] else 'ip4'}/{ipp[0]}/tcp/{ipp[1]}"
            addrs = conn_addrs(c)
            return addrs[0] if addrs else "?"
    return None


class NatChecks:
    """The checks' both sides on ``host``. ``reserved_here(asker)``: the circuit addresses through
    our relay of the peers holding a reservation there (told to an observer's asker)."""

    def __init__(self, host: SwarmHost, config: NatConfig, reserved_here: Callable[[str], list[str]]) -> None:
        self.host = host
        self.config = config
        self.reserved_here = reserved_here
        self._dialbacks = trio.Semaphore(config.dialback_concurrency)
        self._probes: dict[str, list[float]] = {}  # peer ("" = everyone) -> times of its costly checks

    def register(self) -> None:
        self.host.set_handler(NAT_OBSERVE, ObserveRequest, self._on_observe)
        self.host.set_handler(NAT_DIALBACK, DialBackRequest, self._on_dialback,
                              timeout_s=self.config.relay_timeout_s + 10)
        self.host.set_handler(NAT_BANDWIDTH, BandwidthRequest, self._on_bandwidth)

    async def observe(self, peer_id: str) -> Observed:
        """Ask a connected peer at which address(es) it sees our direct connections."""
        return await self.host.request(peer_id, NAT_OBSERVE, ObserveRequest(), Observed,
                                       timeout=self.config.relay_timeout_s)

    async def _on_observe(self, req: ObserveRequest, peer: str) -> Observed:
        seen = []
        for c in conns_of(self.host, peer):
            ipp = remote_ip_port(c)
            if ipp and is_direct(c):
                family = "ip6" if ":" in ipp[0] else "ip4"
                seen.append(f"/{family}/{ipp[0]}/tcp/{ipp[1]}")
        return Observed(addrs=seen[:MAX_ADDRS], peers=self._other_peers(peer), relayed=self.reserved_here(peer))

    def _other_peers(self, asker: str) -> list[str]:
        """Addresses of other peers we hold direct connections to (candidate observers)."""
        from swarm.addrs import with_peer_id

        net = self.host.libp2p_host.get_network()
        store = self.host.libp2p_host.get_peerstore()
        out: list[str] = []
        for pid in list(net.connections.keys()):
            peer = pid.to_base58()
            if peer in (asker, self.host.peer_id) or not direct_addr(self.host, peer):
                continue
            try:
                addrs = [str(a) for a in store.addrs(pid)]
            except Exception:
                continue
            good = [a for a in addrs if CIRCUIT not in a and not is_loopback(a)]
            if good:
                out.append(with_peer_id(split_peer_id(good[0])[0], peer))
            if len(out) >= MAX_ADDRS:
                break
        return out

    async def dial_back(self, peer_id: str, addrs: list[str]) -> DialBackReply:
        """Ask a connected peer to dial us back at ``addrs`` from a fresh host."""
        return await self.host.request(peer_id, NAT_DIALBACK, DialBackRequest(addrs=addrs[:MAX_ADDRS]),
                                       DialBackReply, timeout=self.config.relay_timeout_s + 15)

    async def _on_dialback(self, req: DialBackRequest, peer: str) -> DialBackReply:
        from swarm.addrs import host_ip, with_peer_id
        from swarm.discovery.reach import dial_back

        ips = {ip for c in conns_of(self.host, peer) if is_direct(c) and (ip := connection_remote_ip(c)) is not None}
        if not ips:
            return DialBackReply(False, "", ["no direct connection from you to dial back along"])
        cands = [with_peer_id(split_peer_id(a)[0], peer) for a in req.addrs
                 if str(host_ip(split_peer_id(a)[0])) in ips]
        if not cands:
            return DialBackReply(False, "", [f"none of your addresses is at {', '.join(sorted(ips))}, "
                                             "where your connection comes from"])
        self._admit(peer, "dial-back")
        async with self._dialbacks:
            res = await dial_back(peer, cands, next(iter(ips)))
        return DialBackReply(res.reachable, res.addr or "", [e[:256] for e in res.errors][:MAX_ADDRS])

    def _admit(self, peer: str, what: str) -> None:
        """Raise (the asker gets an error reply) when ``peer`` or everyone asked too often."""
        now, cfg = time.monotonic(), self.config
        if len(self._probes) > 4096:  # forget the quiet peers
            self._probes = {p: t for p, t in self._probes.items() if t and t[-1] > now - 60}
        if not admit_probe(self._probes.setdefault("", []), now, 60.0, cfg.probes_per_min):
            raise SwarmError(f"too many {what} requests from all peers; try again in a minute")
        if not admit_probe(self._probes.setdefault(peer, []), now, 60.0, cfg.probes_per_min_peer):
            log.info("nat: refused a %s to %s (over %d per minute)", what, peer[-8:], cfg.probes_per_min_peer)
            raise SwarmError(f"too many {what} requests; at most {cfg.probes_per_min_peer} per minute")

    async def _on_bandwidth(self, req: BandwidthRequest, peer: str) -> BandwidthReply:
        if req.want or req.payload:
            self._admit(peer, "bandwidth")
        return BandwidthReply(payload=os.urandom(req.want))  # random: zstd cannot shrink it

    async def bandwidth(self, peer_id: str, nbytes: int = 1024 * 1024) -> tuple[float, float]:
        """(upload, download) Mbit/s to a connected peer: ``nbytes`` each way, less the time of
        an empty request (the round trip)."""
        async def timed(req: BandwidthRequest) -> float:
            t0 = time.monotonic()
            await self.host.request(peer_id, NAT_BANDWIDTH, req, BandwidthReply, timeout=120)
            return time.monotonic() - t0

        rtt = await timed(BandwidthRequest())
        up = await timed(BandwidthRequest(payload=os.urandom(nbytes)))
        down = await timed(BandwidthRequest(want=nbytes))
        return nbytes * 8 / max(up - rtt, 1e-3) / 1e6, nbytes * 8 / max(down - rtt, 1e-3) / 1e6
