"""Dialling peers and opening streams for a :class:`swarm.host.SwarmHost`: a mixin, so the host
module keeps to building and running the host.

py-libp2p facts relied on (0.8.x): ``host.connect`` stores the peer's addresses in the
peerstore with a 120 s TTL, and the swarm re-dials from the peerstore when a stream is opened
to an unconnected peer; the addresses are re-added here with a long TTL so a peer that
restarts can be re-dialled much later. An unsupported protocol surfaces as ``StreamFailure``
caused by ``MultiselectClientError``. ``host.connect`` returns at once while the swarm lists any
connection to the peer, even one already closed, and a closed one is left listed when its close
began elsewhere (its second ``close()`` returns early); such a connection makes every later
stream fail with "no valid connections", so closed ones are dropped from the list before dialling.
"""

from __future__ import annotations

import logging
from typing import Any

import multiaddr
import trio

from swarm.errors import PeerUnreachable, SwarmTimeout
from swarm.host_config import CLEANUP_TIMEOUT_S, KNOWN_ADDR_TTL_S, HostConfig

# Records keep the logger name of :mod:`swarm.host`, whose part of the host this is.
log = logging.getLogger("swarm.host")


def _is_protocol_refusal(exc: BaseException) -> bool:
    from libp2p.protocol_muxer.exceptions import MultiselectClientError

    cause = exc.__cause__
    return isinstance(cause, MultiselectClientError) and "not supported" in str(cause)


def forget_closed(network: Any, pid: Any) -> int:
    """Drop ``pid``'s closed connections from py-libp2p's swarm list (see the module); returns how many."""
    closed = [c for c in network.get_connections(pid) if getattr(c, "is_closed", False)]
    for conn in closed:
        try:
            network.remove_conn(conn)
        except Exception as e:
            log.debug("could not forget a closed connection to %s: %s", pid, e)
    return len(closed)


class Dialing:
    """``connect`` and the stream opening behind requests and raw streams. Needs
    ``libp2p_host``, ``config`` and ``_known_addrs`` (peer id -> multiaddrs) from
    :class:`swarm.host.SwarmHost`."""

    libp2p_host: Any  # py-libp2p's host
    config: HostConfig
    _known_addrs: dict[str, list[multiaddr.Multiaddr]]

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
        forget_closed(self.libp2p_host.get_network(), pid)
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
            forget_closed(network, pid)
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
