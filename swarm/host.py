"""A py-libp2p host with a persistent identity and typed request/response protocols.

``open_host`` builds a libp2p host restricted to TCP + Noise + Yamux (py-libp2p's defaults
also offer TLS, SECIO, *plaintext* and mplex; none of them is negotiable here), runs it,
and wraps it in :class:`SwarmHost`::

    async with open_host(data_dir, config=HostConfig()) as host:
        host.set_handler(HELLO, Hello, on_hello)             # server side
        peer = await host.connect("/ip4/.../tcp/4001/p2p/12D3...")
        ack = await host.request(peer, HELLO, hello, HelloAck)  # client side

One request = one stream: the client writes one frame (the request message's wire
dict), the server answers with one envelope frame, ``{"ok": True, "body": {...}}`` or
``{"ok": False, "error": "..."}``, and the stream is closed. Frames are described in
:mod:`swarm.framing`. Whatever a peer sends, the host and its other streams keep running:
garbage gets the stream reset, a bad message or a failing handler gets an error envelope.

py-libp2p facts this module relies on (0.8.x):

- ``new_host(key_pair=, sec_opt=, muxer_opt=, listen_addrs=)`` only builds the host;
  ``host.run(listen_addrs)`` is an async context manager that listens and serves.
- A stream's remote peer is ``stream.muxed_conn.peer_id``.
- ``host.connect`` stores the peer's addresses in the peerstore with a 120 s TTL; the swarm
  re-dials from the peerstore when a stream is opened to an unconnected peer. We re-add the
  addresses with a long TTL so a peer that restarts can be re-dialled much later.
- An unsupported protocol surfaces as ``StreamFailure`` caused by ``MultiselectClientError``.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import multiaddr
import trio

from swarm.errors import (
    EndOfStream,
    FrameError,
    PeerUnreachable,
    RemoteError,
    SwarmTimeout,
    TruncatedFrame,
)
from swarm.framing import DEFAULT_COMPRESS_THRESHOLD, DEFAULT_MAX_FRAME_BYTES, read_frame, write_frame
from swarm.raw_streams import RawStreams
from swarm.wire import Message, WireError

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Message)
Q = TypeVar("Q", bound=Message)
Handler = Callable[[Any, str], Awaitable[Message]]

#: File (inside ``data_dir``) holding the libp2p-protobuf-serialised Ed25519 private key.
IDENTITY_FILE = "identity.key"
IDENTITY_FILE_MODE = 0o600
DEFAULT_LISTEN_ADDR = "/ip4/127.0.0.1/tcp/0"
#: How long (s) addresses learnt through ``connect`` stay in the peerstore for re-dials.
KNOWN_ADDR_TTL_S = 7 * 24 * 3600
#: Longest error text put in an error envelope or read from one.
MAX_ERROR_CHARS = 500
#: Upper bound (s) on closing / resetting a stream during cleanup.
CLEANUP_TIMEOUT_S = 2.0
#: Upper bound (s) on closing the host's connections and listeners at exit.
SHUTDOWN_TIMEOUT_S = 5.0


@dataclass
class HostConfig:
    """Limits and timeouts of a :class:`SwarmHost`. Both ends of a protocol should agree
    on ``max_frame_bytes``; a frame above the receiver's cap is rejected unread."""

    #: Largest frame accepted or sent, bytes (after compression; also caps decompression).
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    #: Frame bodies above this many bytes are zstd-compressed.
    compress_threshold: int = DEFAULT_COMPRESS_THRESHOLD
    #: Default deadline (s) of a whole client request: open stream, send, await the reply.
    #: Keep it above ``handler_timeout_s`` so a slow handler yields an error envelope.
    request_timeout_s: float = 60.0
    #: Deadline (s) for a request handler; past it the client gets an error envelope.
    handler_timeout_s: float = 30.0
    #: Deadline (s) for dialling a peer (TCP connect + Noise + Yamux + identify).
    dial_timeout_s: float = 10.0
    #: Server side: deadline (s) for the request frame to arrive, and for the reply to be
    #: written. Bounds how long a silent or dripping peer can hold a stream.
    frame_timeout_s: float = 30.0
    #: Deadline (s) for a connection's upgrade (multistream-select + Noise + Yamux), in and
    #: out, and for a stream's protocol negotiation. py-libp2p's 10 s fails joins on a busy
    #: learner that many peers dial at once (see :mod:`swarm.join_path`).
    negotiate_timeout_s: float = 30.0
    #: Most connections held at once; idle ones are pruned above 90 % of it (py-libp2p's
    #: defaults, 300 and 200, would drop nodes of a swarm of a few hundred).
    max_connections: int = 1000
    #: Most inbound handshakes (Noise + Yamux upgrades) run at once; the others wait their turn
    #: (0 = no limit). Keeps a join storm from stretching every handshake past its deadline.
    max_concurrent_handshakes: int = 32
    #: Run identify towards every new connection's peer (py-libp2p's default; the DHT needs
    #: it). Off for hosts that need neither a peer's protocol list nor its identify addresses.
    identify_on_connect: bool = True

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if name in ("max_concurrent_handshakes", "identify_on_connect"):
                if not value >= 0:
                    raise ValueError(f"HostConfig.{name} must not be negative, got {value!r}")
                continue
            if not value > 0:
                raise ValueError(f"HostConfig.{name} must be positive, got {value!r}")


# ---------------------------------------------------------------------------- identity


def load_or_create_identity(data_dir: str | os.PathLike[str]) -> Any:
    """The host's Ed25519 ``KeyPair``: read from ``data_dir/identity.key`` or created there
    (mode 0600, written atomically) on first use. Same file -> same peer id."""
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.crypto.keys import KeyPair, KeyType
    from libp2p.crypto.serialization import deserialize_private_key

    path = Path(data_dir) / IDENTITY_FILE
    if path.exists():
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            log.warning("identity file %s had mode %o; tightening to %o", path, mode, IDENTITY_FILE_MODE)
            os.chmod(path, IDENTITY_FILE_MODE)
        try:
            key = deserialize_private_key(path.read_bytes())
        except Exception as e:
            raise ValueError(f"{path} is not a libp2p private key: {e}") from e
        if key.get_type() != KeyType.Ed25519:
            raise ValueError(f"{path} holds a {key.get_type().name} key; an Ed25519 key is required")
        return KeyPair(key, key.get_public_key())
    path.parent.mkdir(parents=True, exist_ok=True)
    key_pair = create_new_key_pair()
    tmp = path.with_name(f".{IDENTITY_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, IDENTITY_FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(key_pair.private_key.serialize())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    log.info("created identity %s", path)
    return key_pair


# ---------------------------------------------------------------------------- the host


def _error_envelope(text: str) -> dict[str, Any]:
    return {"ok": False, "error": text[:MAX_ERROR_CHARS]}


async def _cleanup(stream: Any, *, reset: bool) -> None:
    """Close or reset a stream; shielded and bounded so it runs even while cancelled."""
    with trio.CancelScope(shield=True, deadline=trio.current_time() + CLEANUP_TIMEOUT_S):
        try:
            await (stream.reset() if reset else stream.close())
        except Exception as e:  # the stream is already gone: nothing left to do
            log.debug("stream cleanup failed: %s", e)


def _is_protocol_refusal(exc: BaseException) -> bool:
    from libp2p.protocol_muxer.exceptions import MultiselectClientError

    cause = exc.__cause__
    return isinstance(cause, MultiselectClientError) and "not supported" in str(cause)


class SwarmHost(RawStreams):
    """A running libp2p host. Build it with :func:`open_host`."""

    def __init__(self, libp2p_host: Any, config: HostConfig) -> None:
        #: The underlying py-libp2p ``IHost`` (for raw streams in tests and extensions).
        self.libp2p_host = libp2p_host
        self.config = config
        self._known_addrs: dict[str, list[multiaddr.Multiaddr]] = {}

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

    # ------------------------------------------------------------------ server side

    def set_handler(
        self, protocol_id: str, request_type: type[Q], handler: Callable[[Q, str], Awaitable[Message]]
    ) -> None:
        """Serve ``protocol_id``: each stream carries one ``request_type`` request and gets
        one reply. ``handler(msg, peer_id)`` returns the reply message."""
        from libp2p.custom_types import TProtocol

        async def stream_handler(stream: Any) -> None:
            await self._serve(stream, protocol_id, request_type, handler)

        self.libp2p_host.set_stream_handler(TProtocol(protocol_id), stream_handler)

    async def _serve(self, stream: Any, protocol_id: str, request_type: type[Message], handler: Handler) -> None:
        cfg = self.config
        try:
            peer = stream.muxed_conn.peer_id.to_base58()
        except Exception:
            peer = "?"
        try:
            try:
                raw = await read_frame(stream, max_size=cfg.max_frame_bytes, timeout=cfg.frame_timeout_s)
            except EndOfStream:
                await _cleanup(stream, reset=False)
                return
            except (FrameError, SwarmTimeout) as e:
                log.warning("reset %s stream from %s: %s: %s", protocol_id, peer, type(e).__name__, e)
                await _cleanup(stream, reset=True)
                return
            envelope = await self._handle(raw, peer, protocol_id, request_type, handler)
            try:
                await self._write_reply(stream, envelope)
            except FrameError as e:
                if isinstance(e, TruncatedFrame):
                    raise
                log.warning("reply on %s to %s not sendable: %s", protocol_id, peer, e)
                await self._write_reply(stream, _error_envelope(f"reply not sendable: {e}"))
            await _cleanup(stream, reset=False)
        except Exception as e:  # never let one stream take the host down
            log.warning("%s stream from %s failed: %s: %s", protocol_id, peer, type(e).__name__, e)
            await _cleanup(stream, reset=True)

    async def _handle(
        self, raw: Any, peer: str, protocol_id: str, request_type: type[Message], handler: Handler
    ) -> dict[str, Any]:
        try:
            request = request_type.from_wire(raw)
        except WireError as e:
            log.warning("rejected %s request from %s: %s", protocol_id, peer, e)
            return _error_envelope(f"invalid request: {e}")
        limit = self.config.handler_timeout_s
        reply: Any = None
        try:
            # move_on_after (not fail_after) so a TooSlowError raised *inside* the handler
            # is reported as the handler's own failure, not as our deadline.
            with trio.move_on_after(limit) as scope:
                reply = await handler(request, peer)
        except Exception as e:
            log.warning("%s handler failed for %s: %s: %s", protocol_id, peer, type(e).__name__, e)
            return _error_envelope(f"{type(e).__name__}: {e}")
        if scope.cancelled_caught:
            log.warning("%s handler timed out after %s s for %s", protocol_id, limit, peer)
            return _error_envelope(f"handler timed out after {limit} s")
        if not isinstance(reply, Message):
            log.warning("%s handler returned %s, not a Message", protocol_id, type(reply).__name__)
            return _error_envelope("internal error: handler returned no message")
        return {"ok": True, "body": reply.to_wire()}

    async def _write_reply(self, stream: Any, envelope: dict[str, Any]) -> None:
        cfg = self.config
        await write_frame(stream, envelope, timeout=cfg.frame_timeout_s,
                          compress_threshold=cfg.compress_threshold, max_size=cfg.max_frame_bytes)

    # ------------------------------------------------------------------ client side

    async def connect(self, addr: str) -> str:
        """Dial ``addr`` (which must end in ``/p2p/<peer id>``) and keep the connection.
        Returns the peer id. Raises :class:`PeerUnreachable` or :class:`SwarmTimeout`."""
        from libp2p.peer.peerinfo import info_from_p2p_addr

        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        except Exception as e:
            raise PeerUnreachable(f"bad peer address {addr!r}: {e}") from e
        peer = info.peer_id.to_base58()
        self._known_addrs[peer] = list(info.addrs)
        # An explicit address is news: forget that the peer failed at other addresses lately.
        getattr(self.libp2p_host.get_network(), "unblock_peer", lambda pid: None)(info.peer_id)
        await self._dial(info.peer_id)
        return peer

    async def _dial(self, pid: Any) -> None:
        from libp2p.peer.peerinfo import PeerInfo

        addrs = self._known_addrs.get(pid.to_base58(), [])
        try:
            with trio.fail_after(self.config.dial_timeout_s):
                await self.libp2p_host.connect(PeerInfo(pid, addrs))
        except trio.TooSlowError as e:
            raise SwarmTimeout(f"dialling {pid} took over {self.config.dial_timeout_s} s") from e
        except Exception as e:
            raise PeerUnreachable(f"cannot dial {pid}: {type(e).__name__}: {e}") from e
        if addrs:  # connect() stores them with a short TTL; keep them for later re-dials
            self.libp2p_host.get_peerstore().add_addrs(pid, addrs, KNOWN_ADDR_TTL_S)

    async def _open_stream(self, pid: Any, protocol_id: str) -> Any:
        """Open a stream, re-dialling once (after dropping the old connection) when the
        first attempt fails for any reason other than the peer refusing the protocol."""
        from libp2p.custom_types import TProtocol

        network = self.libp2p_host.get_network()
        for attempt in (1, 2):
            tried = list(network.get_connections(pid))
            try:
                return await self.libp2p_host.new_stream(pid, [TProtocol(protocol_id)])
            except Exception as e:
                if _is_protocol_refusal(e):
                    raise PeerUnreachable(f"{pid} does not serve {protocol_id}") from e
                if attempt == 2:
                    raise PeerUnreachable(f"cannot open {protocol_id} stream to {pid}: {e}") from e
                log.info("stream to %s failed (%s: %s); re-dialling", pid, type(e).__name__, e)
            # A connection that cannot open a stream is broken (e.g. the peer restarted and
            # libp2p has not noticed yet) and host.connect would happily reuse it, so close
            # it; only the ones just tried, not a fresh one a concurrent request re-dialled.
            with trio.move_on_after(CLEANUP_TIMEOUT_S):
                for conn in tried:
                    try:
                        await conn.close()
                    except Exception as e:
                        log.debug("closing a connection to %s failed: %s", pid, e)
            await self._dial(pid)
        raise AssertionError("unreachable")

    async def request(
        self, peer_id: str, protocol_id: str, msg: Message, reply_type: type[R], timeout: float | None = None
    ) -> R:
        """Send ``msg`` on a new ``protocol_id`` stream and return the validated reply.

        Raises :class:`RemoteError` (error envelope), :class:`FrameError` (bad bytes or
        the peer closed without replying), :class:`WireError` (reply breaks its schema),
        :class:`SwarmTimeout` (past ``timeout``, default ``config.request_timeout_s``) and
        :class:`PeerUnreachable` (no stream could be opened, after one re-dial).
        """
        from libp2p.peer.id import ID

        cfg = self.config
        timeout = cfg.request_timeout_s if timeout is None else timeout
        try:
            pid = ID.from_base58(peer_id)
        except Exception as e:
            raise PeerUnreachable(f"bad peer id {peer_id!r}: {e}") from e
        stream = None
        ok = False
        try:
            with trio.fail_after(timeout):
                stream = await self._open_stream(pid, protocol_id)
                await write_frame(stream, msg.to_wire(), timeout=timeout,
                                  compress_threshold=cfg.compress_threshold, max_size=cfg.max_frame_bytes)
                try:
                    envelope = await read_frame(stream, max_size=cfg.max_frame_bytes, timeout=timeout)
                except EndOfStream as e:
                    raise TruncatedFrame(f"{peer_id} closed the {protocol_id} stream without replying") from e
                ok = True
        except trio.TooSlowError as e:
            if isinstance(e, SwarmTimeout):
                raise
            raise SwarmTimeout(f"{protocol_id} request to {peer_id} took over {timeout} s") from e
        finally:
            if stream is not None:
                await _cleanup(stream, reset=not ok)
        return _unwrap(envelope, reply_type, peer_id, protocol_id)

    def private_key(self) -> Any:
        """The host's libp2p identity private key (Ed25519), e.g. to sign manifests."""
        return self.libp2p_host.get_private_key()


def _unwrap(envelope: Any, reply_type: type[R], peer_id: str, protocol_id: str) -> R:
    """Validate a reply envelope and decode its body."""
    if not isinstance(envelope, dict) or not isinstance(envelope.get("ok"), bool):
        raise WireError(f"{protocol_id}: reply from {peer_id} is not an envelope")
    if not envelope["ok"]:
        error = envelope.get("error")
        text = error[:MAX_ERROR_CHARS] if isinstance(error, str) else "unspecified error"
        raise RemoteError(text, peer_id=peer_id, protocol=protocol_id)
    if "body" not in envelope:
        raise WireError(f"{protocol_id}: reply envelope from {peer_id} has no body")
    return reply_type.from_wire(envelope["body"])


def _check_tcp_addr(addr: multiaddr.Multiaddr) -> None:
    names = [p.name for p in addr.protocols()]
    if len(names) != 2 or names[0] not in ("ip4", "ip6") or names[1] != "tcp":
        raise ValueError(f"listen address must be /ip4|ip6/<host>/tcp/<port>, got {addr}")


def _build_libp2p_host(key_pair: Any, listen: multiaddr.Multiaddr, announce: list[str] = (),
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
    from swarm.join_path import connection_config, disable_auto_identify, pace_inbound_handshakes

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
    if not config.identify_on_connect:
        disable_auto_identify(host)
    return host


@asynccontextmanager
async def open_host(
    data_dir: str | os.PathLike[str], *, listen_addr: str = DEFAULT_LISTEN_ADDR, config: HostConfig | None = None,
    announce: list[str] = (),
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

