"""NAT traversal on a running :class:`swarm.host.SwarmHost`: circuit relay v2 (served when
``NatConfig.serve_relay``, used as a client always), DCUtR hole punching with retries and
backoff, and the NAT checks other peers ask of us (``swarm.proto.nat``; :mod:`swarm.nat.checks`)::

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

from swarm.addrs import split_peer_id
from swarm.dialing import forget_closed
from swarm.errors import PeerUnreachable, SwarmError
from swarm.nat.config import NatConfig
from swarm.nat.checks import CIRCUIT, NatChecks, conns_of, direct_addr, is_direct
from swarm.nat.kinds import backoff_s, circuit_peer
from swarm.nat.records import ALREADY, FAILED, PUNCHED, PunchBook, PunchOutcome
from swarm.proto.nat import MAX_ADDRS, DialBackReply, Observed

log = logging.getLogger(__name__)

#: Deadline (s) of one simultaneous-open dial of a hole punch (upstream's round lasts as long).
PUNCH_DIAL_TIMEOUT_S = 5


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
        #: The NAT checks other peers ask of us, and ours of them.
        self.checks = NatChecks(host, cfg, self._reserved_here)
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ service
    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        from libp2p.tools.anyio_service import background_trio_service

        self.checks.register()
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
        return conns_of(self.host, peer_id)

    def direct_addr(self, peer_id: str) -> str | None:
        """The remote address of a direct (not relayed) connection to ``peer_id``, if any."""
        return direct_addr(self.host, peer_id)

    def relayed(self, peer_id: str) -> bool:
        return any(not is_direct(c) for c in self._conns(peer_id))

    async def drop_relayed(self, peer_id: str) -> int:
        """Close the relayed connections to ``peer_id`` while a direct one exists (returns how
        many). A punch's relayed connection carried its signalling only; upstream DCUtR would
        keep it 60 s, holding one of the relay's circuits per punched pair (``relay_max_circuits``
        per reservation) and tearing them all down later, in the middle of whatever runs then."""
        from libp2p.peer.id import ID

        if self.direct_addr(peer_id) is None:
            return 0
        relayed = [c for c in self._conns(peer_id) if not is_direct(c)]
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
        """:meth:`swarm.nat.checks.NatChecks.observe`."""
        return await self.checks.observe(peer_id)

    async def dial_back(self, peer_id: str, addrs: list[str]) -> DialBackReply:
        """:meth:`swarm.nat.checks.NatChecks.dial_back`."""
        return await self.checks.dial_back(peer_id, addrs)

    async def bandwidth(self, peer_id: str, nbytes: int = 1024 * 1024) -> tuple[float, float]:
        """:meth:`swarm.nat.checks.NatChecks.bandwidth`."""
        return await self.checks.bandwidth(peer_id, nbytes)

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
