"""A py-libp2p host with a persistent identity and typed request/response protocols.

``open_host`` builds a libp2p host restricted to TCP + Noise + Yamux (py-libp2p's defaults
also offer TLS, SECIO, *plaintext* and mplex; none of them is negotiable here), runs it,
and wraps it in :class:`SwarmHost`::

    async with open_host(data_dir, config=HostConfig()) as host:
        host.set_handler(HELLO, Hello, on_hello)             # server side
        peer = await host.connect("/ip4/.../tcp/4001/p2p/12D3...")
        ack = await host.request(peer, HELLO, hello, HelloAck)  # client side

One request = one stream, answered by one envelope frame (:mod:`swarm.request_reply`).
The host's parts live in their own modules and are re-exported here, so callers import
everything from ``swarm.host``:

- :mod:`swarm.host_config`: :class:`HostConfig` and the host's fixed limits;
- :mod:`swarm.host_identity`: the persistent Ed25519 identity in ``data_dir``;
- :mod:`swarm.dialing`: ``connect`` and stream opening with one re-dial;
- :mod:`swarm.request_reply`: ``set_handler`` / ``request`` and their envelopes (raw streams,
  for protocols that are not one request and one reply, are the host's own methods);
- :mod:`swarm.join_path`: connection limits, deadlines and handshake pacing under many joins.

py-libp2p facts this module relies on (0.8.x):

- ``new_host(key_pair=, sec_opt=, muxer_opt=, listen_addrs=)`` only builds the host;
  ``host.run(listen_addrs)`` is an async context manager that listens and serves.
- A stream's remote peer is ``stream.muxed_conn.peer_id``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import multiaddr
import trio

from swarm.dialing import Dialing
from swarm.errors import PeerUnreachable, SwarmTimeout
from swarm.gate import StreamGate
from swarm.host_config import (
    CLEANUP_TIMEOUT_S,
    DEFAULT_LISTEN_ADDR,
    KNOWN_ADDR_TTL_S,
    MAX_ERROR_CHARS,
    SHUTDOWN_TIMEOUT_S,
    HostConfig,
)
from swarm.host_identity import IDENTITY_FILE, IDENTITY_FILE_MODE, PrivateKey, load_or_create_identity
from swarm.request_reply import Handler, RequestReply

__all__ = [
    "CLEANUP_TIMEOUT_S",
    "DEFAULT_LISTEN_ADDR",
    "IDENTITY_FILE",
    "IDENTITY_FILE_MODE",
    "KNOWN_ADDR_TTL_S",
    "MAX_ERROR_CHARS",
    "SHUTDOWN_TIMEOUT_S",
    "Handler",
    "HostConfig",
    "SwarmHost",
    "load_or_create_identity",
    "open_host",
]

log = logging.getLogger(__name__)


class SwarmHost(RequestReply, Dialing):
    """A running libp2p host. Build it with :func:`open_host`."""

    def __init__(self, libp2p_host: Any, config: HostConfig) -> None:
        #: The underlying py-libp2p ``IHost`` (for raw streams in tests and extensions).
        self.libp2p_host = libp2p_host
        self.config = config
        self._known_addrs: dict[str, list[multiaddr.Multiaddr]] = {}
        #: Budgets of every incoming stream, checked before its handler runs (:mod:`swarm.gate`).
        self.gate = StreamGate(config.limits)

    @property
    def peer_id(self) -> str:
        return self.libp2p_host.get_id().to_base58()

    @property
    def addrs(self) -> list[str]:
        """Advertised addresses (:meth:`advertised_addrs`), each ending in ``/p2p/<peer id>``."""
        return self.advertised_addrs()

    def advertised_addrs(self, for_peer: str | None = None) -> list[str]:
        """Our dialable addresses (never 0.0.0.0; see :mod:`swarm.addrs`), each ending in
        ``/p2p/<peer id>``. ``for_peer``: only those worth sending to that connected peer
        (no loopback address unless it is on this machine); None: all, non-loopback first."""
        from swarm.addrs import connection_remote_ip, display_order, for_remote, with_peer_id

        ours = [with_peer_id(str(a), self.peer_id) for a in self.libp2p_host.get_addrs()]
        if for_peer is None:
            return display_order(ours)
        from libp2p.peer.id import ID

        conns = self.libp2p_host.get_network().get_connections(ID.from_base58(for_peer))
        ips = [ip for ip in map(connection_remote_ip, conns) if ip is not None]
        return for_remote(ours, ips[0] if ips else None)

    def rtt(self, peer_id: str) -> float | None:
        """The smoothed round trip (s) to a connected peer as its muxer measures it (yamux pings
        half a second after connecting, then every 30 s), the smallest over its connections; None
        when not connected or not measured yet. Waits that an honest slow link can exceed scale
        with it (:func:`swarm.rtt.scaled`)."""
        from libp2p.peer.id import ID

        try:
            conns = self.libp2p_host.get_network().get_connections(ID.from_base58(peer_id))
        except Exception:  # a malformed peer id: no connection to it
            return None
        measured = []
        for conn in conns:
            muxed = conn.muxed_conn
            rtt = muxed.rtt() if callable(getattr(muxed, "rtt", None)) else 0.0
            if rtt > 0:
                measured.append(float(rtt))
        return min(measured) if measured else None

    def private_key(self) -> PrivateKey:
        """The host's libp2p identity private key (Ed25519), e.g. to sign manifests."""
        return self.libp2p_host.get_private_key()

    # -- raw streams: protocols that are not one request and one reply (chunk pushes) --------
    def set_stream_handler(self, protocol_id: str, handler: Callable[[Any, str], Awaitable[None]]) -> None:
        """Serve ``protocol_id`` with a raw stream handler ``handler(stream, peer_id)`` (for
        protocols that are not one request/one reply). The handler owns the stream, which it
        gets only once the host's budgets admitted it (:class:`swarm.gate.GatedStream`)."""
        from libp2p.custom_types import TProtocol

        async def stream_handler(stream: Any) -> None:
            async def run(gated: Any) -> None:
                await handler(gated, gated.peer)

            await self.gate.serve(stream, protocol_id, run)

        self.libp2p_host.set_stream_handler(TProtocol(protocol_id), stream_handler)

    async def open_stream(self, peer_id: str, protocol_id: str, timeout: float | None = None) -> Any:
        """A raw ``protocol_id`` stream to a connected (or known) peer; the caller closes it.
        Raises :class:`PeerUnreachable` or :class:`SwarmTimeout`."""
        from libp2p.peer.id import ID

        timeout = self.config.dial_timeout_s if timeout is None else timeout
        try:
            pid = ID.from_base58(peer_id)
        except Exception as e:
            raise PeerUnreachable(f"bad peer id {peer_id!r}: {e}") from e
        try:
            with trio.fail_after(timeout):
                return await self._open_stream(pid, protocol_id)
        except trio.TooSlowError as e:
            if isinstance(e, SwarmTimeout):
                raise
            raise SwarmTimeout(f"opening a {protocol_id} stream to {peer_id} took over {timeout} s") from e


def _check_tcp_addr(addr: multiaddr.Multiaddr) -> None:
    names = [p.name for p in addr.protocols()]
    if len(names) != 2 or names[0] not in ("ip4", "ip6") or names[1] != "tcp":
        raise ValueError(f"listen address must be /ip4|ip6/<host>/tcp/<port>, got {addr}")


def _build_libp2p_host(key_pair: Any, listen: multiaddr.Multiaddr, announce: Sequence[str] = (),
                       config: HostConfig | None = None) -> Any:
    """A py-libp2p host offering exactly Noise for security and Yamux for multiplexing, with
    the connection limits and deadlines of ``config`` (:mod:`swarm.join_path`)."""
    from libp2p import new_host
    from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
    from libp2p.custom_types import TProtocol
    from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
    from libp2p.security.noise.transport import Transport as NoiseTransport
    from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
    from libp2p.stream_muxer.yamux.yamux import Yamux

    from swarm.addrs import addrs_factory
    from swarm.join_path import (connection_config, disable_auto_identify, free_inbound_slot_on_close,
                                 pace_inbound_handshakes)

    config = config or HostConfig()
    # Noise needs its own static X25519 key; the libp2p identity key signs it in the handshake.
    noise = NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)
    host = new_host(
        key_pair=key_pair,
        sec_opt={TProtocol(NOISE_PROTOCOL_ID): noise},
        muxer_opt={TProtocol(YAMUX_PROTOCOL_ID): Yamux},
        listen_addrs=[listen],
        enable_quic=False,
        enable_mDNS=False,
        enable_upnp=False,
        addrs_factory=addrs_factory(list(announce)),
        connection_config=connection_config(config),
        negotiate_timeout=max(1, round(config.negotiate_timeout_s)),
    )
    pace_inbound_handshakes(host, config.max_concurrent_handshakes)
    free_inbound_slot_on_close(host)
    if not config.identify_on_connect:
        disable_auto_identify(host)
    return host


@asynccontextmanager
async def open_host(
    data_dir: str | os.PathLike[str], *, listen_addr: str = DEFAULT_LISTEN_ADDR, config: HostConfig | None = None,
    announce: Sequence[str] = (),
) -> AsyncIterator[SwarmHost]:
    """Start a host with the identity kept in ``data_dir``, listening on ``listen_addr``
    (TCP only; port 0 picks a free port, see ``host.addrs``) and also advertising the
    ``announce`` multiaddrs (public address, port mapping). Stops it on exit."""
    listen = multiaddr.Multiaddr(listen_addr)
    _check_tcp_addr(listen)
    key_pair = load_or_create_identity(data_dir)
    config = config or HostConfig()
    libp2p_host = _build_libp2p_host(key_pair, listen, announce, config)
    async with libp2p_host.run([listen]):
        host = SwarmHost(libp2p_host, config)
        log.info("host %s listening on %s", host.peer_id, ", ".join(host.addrs))
        try:
            yield host
        finally:
            await _close_network(libp2p_host)


async def _close_network(libp2p_host: Any) -> None:
    """Close connections and listening sockets explicitly before ``run()`` exits.

    py-libp2p 0.8.1 closes its listeners from a ``finally`` that runs under the cancelled
    service scope, so the TCP listener leaks: the port stays bound (SO_REUSEPORT) for the
    life of the process and a host restarted on the same port gets half the new dials
    delivered to the dead listener. ``Swarm.close()`` is idempotent.
    """
    with trio.CancelScope(shield=True, deadline=trio.current_time() + SHUTDOWN_TIMEOUT_S):
        try:
            await libp2p_host.get_network().close()
        except Exception as e:
            log.warning("closing the libp2p network failed: %s: %s", type(e).__name__, e)

