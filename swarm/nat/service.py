"""NAT traversal on a running :class:`swarm.host.SwarmHost`: circuit relay v2 (served when
``NatConfig.serve_relay``, used as a client always), DCUtR hole punching with retries and
backoff, and the two NAT checks other peers ask of us (``swarm.proto.nat``)::

    nat = NatService(host, NatConfig(serve_relay=True))
    async with trio.open_nursery() as nursery:
        await nursery.start(nat.run)
        await nat.reserve(relay_addr)              # a NAT'd peer: be reachable via the relay
        out = await nat.punch(peer_id, f"{relay_addr}/p2p-circuit/p2p/{peer_id}")
        out.ok, out.how, out.seconds               # also in nat.book, per pair of peers

The relay is for signalling: its caps (``relay_circuit_bytes``, ``relay_circuit_s``,
``relay_max_circuits``, ``relay_max_reservations``) stop it carrying bulk data; bulk data goes
over direct links.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import multiaddr
import trio

from swarm.addrs import connection_remote_ip, is_loopback, split_peer_id
from swarm.dialing import forget_closed
from swarm.errors import PeerUnreachable, SwarmError
from swarm.nat.config import NatConfig
from swarm.nat.kinds import admit_probe, backoff_s, circuit_peer
from swarm.nat.records import ALREADY, FAILED, PUNCHED, PunchBook, PunchOutcome
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

log = logging.getLogger(__name__)

CIRCUIT = "/p2p-circuit"
#: Deadline (s) of one simultaneous-open dial of a hole punch (upstream's round lasts as long).
PUNCH_DIAL_TIMEOUT_S = 5


def _conn_addrs(conn: Any) -> list[str]:
    try:
        return [str(a) for a in conn.get_transport_addresses()]
    except Exception:
        return []


def _is_direct(conn: Any) -> bool:
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
    addrs = _conn_addrs(conn)
    return bool(addrs) and not any(CIRCUIT in a for a in addrs)


def _remote_ip_port(conn: Any) -> tuple[str, int] | None:
    try:
        remote = conn.muxed_conn.get_remote_address()
    except Exception:
        return None
    if isinstance(remote, tuple) and len(remote) >= 2:
        return str(remote[0]), int(remote[1])
    return None


class NatService:
    """Relay, hole punching and NAT checks of one host. Build it whole, start :meth:`run` in a
    nursery, then call the other methods."""

    def __init__(self, host: Any, config: NatConfig | None = None, book: PunchBook | None = None) -> None:
        from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
        from libp2p.relay.circuit_v2.resources import RelayLimits
        from libp2p.relay.circuit_v2.transport import CircuitV2Transport

        from swarm.nat.dcutr import PunchingDCUtR
        from swarm.nat.relay import CountingRelay

        self.host = host
        self.config = config or NatConfig()
        #: Every punch outcome, per pair of peers.
        self.book = book if book is not None else PunchBook()
        cfg = self.config
        limits = RelayLimits(duration=cfg.relay_circuit_s, data=cfg.relay_circuit_bytes,
                             max_circuit_conns=cfg.relay_max_circuits, max_reservations=cfg.relay_max_reservations)
        lh = host.libp2p_host
        self._relay = CountingRelay(lh, limits=limits, allow_hop=cfg.serve_relay)
        roles = RelayRole.STOP | RelayRole.CLIENT | (RelayRole.HOP if cfg.serve_relay else RelayRole(0))
        self._transport = CircuitV2Transport(lh, self._relay, RelayConfig(roles=roles, limits=limits))
        # one simultaneous-open dial (TCP and the Noise + Yamux upgrade) within one attempt
        self._dcutr = PunchingDCUtR(lh, dial_timeout=max(1, min(PUNCH_DIAL_TIMEOUT_S, int(cfg.punch_timeout_s))))
        self._dialbacks = trio.Semaphore(cfg.dialback_concurrency)
        self._probes: dict[str, list[float]] = {}  # peer ("" = everyone) -> times of its costly checks
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ service
    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        from libp2p.tools.anyio_service import background_trio_service

        self.host.set_handler(NAT_OBSERVE, ObserveRequest, self._on_observe)
        self.host.set_handler(NAT_DIALBACK, DialBackRequest, self._on_dialback,
                              timeout_s=self.config.relay_timeout_s + 10)
        self.host.set_handler(NAT_BANDWIDTH, BandwidthRequest, self._on_bandwidth)
        async with background_trio_service(self._relay), background_trio_service(self._dcutr):
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                log.info("nat: %s (relay %s)", self.host.peer_id, "served" if self.config.serve_relay else "client only")
                task_status.started()
                try:
                    await trio.sleep_forever()
                finally:
                    if self.config.serve_relay:
                        st = self._relay.stats
                        log.info("nat: the relay carried %d bytes over %d circuit directions", st.bytes,
                                 st.directions)

    # ------------------------------------------------------------------ relay
    def relay_stats(self) -> dict:
        """What our relay carried (circuit directions, bytes, open now), as measured."""
        return self._relay.stats.to_json()

    async def reserve(self, relay_addr: str) -> str:
        """Reserve a slot at the relay ``relay_addr`` (``.../p2p/<relay id>``): peers can then
        reach us at the returned circuit address. Raises :class:`SwarmError` on refusal."""
        from libp2p.peer.id import ID
        from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID

        if self._nursery is None:
            raise SwarmError("NatService.run is not started")
        _, relay_id = split_peer_id(relay_addr)
        if relay_id is None:
            raise SwarmError(f"relay address needs /p2p/<id>: {relay_addr}")
        with trio.fail_after(self.config.relay_timeout_s):
            await self.host.connect(relay_addr)
            stream = await self.host.libp2p_host.new_stream(ID.from_base58(relay_id), [PROTOCOL_ID])
            ok = await self._transport.reserve(stream, ID.from_base58(relay_id), self._nursery)
        if not ok:
            raise SwarmError(f"relay {relay_id} refused a reservation")
        return f"{relay_addr}{CIRCUIT}/p2p/{self.host.peer_id}"

    async def connect_relayed(self, circuit_addr: str) -> str:
        """Open a connection to a peer through a relay (``<relay addr>/p2p-circuit/p2p/<peer>``);
        returns the peer id."""
        peer = circuit_peer(circuit_addr)
        if peer is None:
            raise SwarmError(f"not a circuit address: {circuit_addr}")
        try:
            with trio.fail_after(self.config.relay_timeout_s):
                await self._transport.dial(multiaddr.Multiaddr(circuit_addr))
        except trio.TooSlowError as e:
            raise PeerUnreachable(f"no circuit to {peer} in {self.config.relay_timeout_s} s") from e
        except Exception as e:
            raise PeerUnreachable(f"circuit to {peer} failed: {type(e).__name__}: {e}") from e
        return peer

    # ------------------------------------------------------------------ connections
    def _conns(self, peer_id: str) -> list[Any]:
        from libp2p.peer.id import ID

        try:
            return list(self.host.libp2p_host.get_network().get_connections(ID.from_base58(peer_id)))
        except Exception:
            return []

    def direct_addr(self, peer_id: str) -> str | None:
        """The remote address of a direct (not relayed) connection to ``peer_id``, if any."""
        for c in self._conns(peer_id):
            if _is_direct(c):
                ipp = _remote_ip_port(c)
                if ipp:
                    return f"/{'ip6' if ':' in ipp[0] else 'ip4'}/{ipp[0]}/tcp/{ipp[1]}"
                addrs = _conn_addrs(c)
                return addrs[0] if addrs else "?"
        return None

    def relayed(self, peer_id: str) -> bool:
        return any(not _is_direct(c) for c in self._conns(peer_id))

    async def drop_relayed(self, peer_id: str) -> int:
        """Close the relayed connections to ``peer_id`` while a direct one exists (returns how
        many). A punch's relayed connection carried its signalling only; upstream DCUtR would
        keep it 60 s, holding one of the relay's circuits per punched pair (``relay_max_circuits``
        per reservation) and tearing them all down later, in the middle of whatever runs then."""
        from libp2p.peer.id import ID

        if self.direct_addr(peer_id) is None:
            return 0
        relayed = [c for c in self._conns(peer_id) if not _is_direct(c)]
        for conn in relayed:
            with trio.move_on_after(self.config.relay_timeout_s):
                try:
                    await conn.close()
                except Exception as e:  # already closing from the far end: nothing to undo
                    log.debug("nat: closing a relayed connection to %s: %s", peer_id[-8:], e)
        if relayed:
            forget_closed(self.host.libp2p_host.get_network(), ID.from_base58(peer_id))
        return len(relayed)

    # ------------------------------------------------------------------ hole punching
    async def punch(self, peer_id: str, circuit_addr: str | None = None) -> PunchOutcome:
        """A direct connection to ``peer_id``: up to ``punch_attempts`` DCUtR attempts over a
        relayed connection (opened through ``circuit_addr`` if there is none), waiting
        :func:`~swarm.nat.kinds.backoff_s` between them. Never raises for network failures;
        the outcome is recorded in :attr:`book` and returned."""
        from libp2p.peer.id import ID

        cfg, t0 = self.config, time.monotonic()

        def done(ok: bool, how: str, attempts: int, reason: str) -> PunchOutcome:
            out = PunchOutcome(self.host.peer_id, peer_id, ok, how, attempts, time.monotonic() - t0, reason,
                               self.direct_addr(peer_id) or "")
            self.book.record(out)
            log.info("nat: punch %s -> %s: %s after %d attempt(s), %.2f s%s", self.host.peer_id[-8:], peer_id[-8:],
                     how, attempts, out.seconds, f" ({reason})" if reason else "")
            return out

        if self.direct_addr(peer_id):
            return done(True, ALREADY, 0, "a direct connection already existed")
        reason = ""
        await self.wait_observed()
        for attempt in range(cfg.punch_attempts):
            await trio.sleep(backoff_s(attempt, cfg.punch_backoff_s, cfg.punch_backoff_max_s))
            try:
                if not self.relayed(peer_id):
                    if circuit_addr is None:
                        return done(False, FAILED, attempt, "no relayed connection to signal over")
                    await self.connect_relayed(circuit_addr)
                with trio.move_on_after(cfg.punch_timeout_s):
                    await self._dcutr.punch_once(ID.from_base58(peer_id))
            except (SwarmError, ValueError) as e:
                reason = f"{type(e).__name__}: {e}"
                continue
            if self.direct_addr(peer_id):
                out = done(True, PUNCHED, attempt + 1, "")  # timed to the direct connection
                await self.drop_relayed(peer_id)
                return out
            reason = "no direct connection after the DCUtR exchange and its dials"
        return done(False, FAILED, cfg.punch_attempts, reason)

    # ------------------------------------------------------------------ NAT checks
    async def observe(self, peer_id: str) -> Observed:
        """Ask a connected peer at which address(es) it sees our direct connections."""
        return await self.host.request(peer_id, NAT_OBSERVE, ObserveRequest(), Observed,
                                       timeout=self.config.relay_timeout_s)

    async def _on_observe(self, req: ObserveRequest, peer: str) -> Observed:
        seen = []
        for c in self._conns(peer):
            ipp = _remote_ip_port(c)
            if ipp and _is_direct(c):
                family = "ip6" if ":" in ipp[0] else "ip4"
                seen.append(f"/{family}/{ipp[0]}/tcp/{ipp[1]}")
        return Observed(addrs=seen[:MAX_ADDRS], peers=self._other_peers(peer), relayed=self._reserved_here(peer))

    def _reserved_here(self, asker: str) -> list[str]:
        """Circuit addresses through us of the peers holding a reservation at our relay."""
        if not self.config.serve_relay:
            return []
        mine = self.host.advertised_addrs(for_peer=asker)
        if not mine:
            return []
        out = []
        for pid in list(self.host.libp2p_host.get_network().connections.keys()):
            peer = pid.to_base58()
            if peer != asker and self._relay.resource_manager.has_reservation(pid):
                out.append(f"{mine[0]}{CIRCUIT}/p2p/{peer}")
            if len(out) >= MAX_ADDRS:
                break
        return out

    def _other_peers(self, asker: str) -> list[str]:
        """Addresses of other peers we hold direct connections to (candidate observers)."""
        from swarm.addrs import with_peer_id

        net = self.host.libp2p_host.get_network()
        store = self.host.libp2p_host.get_peerstore()
        out: list[str] = []
        for pid in list(net.connections.keys()):
            peer = pid.to_base58()
            if peer in (asker, self.host.peer_id) or not self.direct_addr(peer):
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

        ips = {ip for c in self._conns(peer) if _is_direct(c) and (ip := connection_remote_ip(c)) is not None}
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
        import os

        if req.want or req.payload:
            self._admit(peer, "bandwidth")
        return BandwidthReply(payload=os.urandom(req.want))  # random: zstd cannot shrink it

    async def bandwidth(self, peer_id: str, nbytes: int = 1024 * 1024) -> tuple[float, float]:
        """(upload, download) Mbit/s to a connected peer: ``nbytes`` each way, less the time of
        an empty request (the round trip)."""
        import os

        async def timed(req: BandwidthRequest) -> float:
            t0 = time.monotonic()
            await self.host.request(peer_id, NAT_BANDWIDTH, req, BandwidthReply, timeout=120)
            return time.monotonic() - t0

        rtt = await timed(BandwidthRequest())
        up = await timed(BandwidthRequest(payload=os.urandom(nbytes)))
        down = await timed(BandwidthRequest(want=nbytes))
        return nbytes * 8 / max(up - rtt, 1e-3) / 1e6, nbytes * 8 / max(down - rtt, 1e-3) / 1e6

    async def dial_from_listen_port(self, addr: str) -> str:
        """Dial ``addr`` (``.../p2p/<id>``) from our listening TCP port, as a hole punch does, so
        the NAT maps the port peers will be told about; returns the peer id."""
        from libp2p.peer.id import ID

        base, peer = split_peer_id(addr)
        if peer is None:
            raise SwarmError(f"address needs /p2p/<id>: {addr}")
        port = self.listen_port()
        try:
            with trio.fail_after(self.host.config.dial_timeout_s):
                await self.host.libp2p_host.get_network().dial_addr(multiaddr.Multiaddr(base), ID.from_base58(peer),
                                                                    ("0.0.0.0", port))
        except trio.TooSlowError as e:
            raise PeerUnreachable(f"no answer from {addr}") from e
        except Exception as e:
            raise PeerUnreachable(f"{addr}: {type(e).__name__}: {e}") from e
        return peer

    def listen_port(self) -> int:
        """Our listening TCP port."""
        from swarm.nat.kinds import parse_ip_tcp

        net = self.host.libp2p_host.get_network()
        for listener in list(getattr(net, "listeners", {}).values()):
            for a in listener.get_addrs():
                got = parse_ip_tcp(str(a))
                if got:
                    return got[1]
        raise SwarmError("the host listens on no TCP port")

    async def wait_observed(self, timeout_s: float = 3.0) -> bool:
        """Wait (at most ``timeout_s``) until some peer's identify told us our public address:
        DCUtR advertises that address (with our listening port) to the peer it punches with,
        and only our private addresses before it. True if one is known."""
        manager = getattr(self.host.libp2p_host, "_observed_addr_manager", None)
        if manager is None:
            return False
        with trio.move_on_after(timeout_s):
            while not [a for a in manager.addrs(min_observers=1) if CIRCUIT not in str(a)]:
                await trio.sleep(0.05)  # identify fills it; it has no event to wait on
            return True
        return False


@asynccontextmanager
async def nat_running(host: Any, config: NatConfig | None = None) -> AsyncIterator[NatService]:
    """A :class:`NatService` on ``host``, started on entry and stopped on exit."""
    nat = NatService(host, config)
    async with trio.open_nursery() as nursery:
        await nursery.start(nat.run)
        try:
            yield nat
        finally:
            nursery.cancel_scope.cancel()
