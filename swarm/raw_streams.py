"""Raw (not request/response) streams of a :class:`swarm.host.SwarmHost`: a mixin, so the
host module keeps to framing and the request protocol."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from swarm.errors import PeerUnreachable, SwarmTimeout


class RawStreams:
    """``set_stream_handler`` / ``open_stream`` for protocols that are not one request and
    one reply (chunk pushes, for instance). Needs ``libp2p_host``, ``config`` and
    ``_open_stream`` from :class:`swarm.host.SwarmHost`."""

    def set_stream_handler(self, protocol_id: str, handler: Callable[[Any, str], Awaitable[None]]) -> None:
        """Serve ``protocol_id`` with a raw stream handler ``handler(stream, peer_id)`` (for
        protocols that are not one request/one reply). The handler owns the stream."""
        from libp2p.custom_types import TProtocol

        async def stream_handler(stream: Any) -> None:
            try:
                peer = stream.muxed_conn.peer_id.to_base58()
            except Exception:
                peer = "?"
            await handler(stream, peer)

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
