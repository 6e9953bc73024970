"""Typed request/response protocols of a :class:`swarm.host.SwarmHost`: a mixin serving and
sending one request and one reply per stream.

The client writes one frame (the request message's wire dict), the server answers with one
envelope frame, ``{"ok": True, "body": {...}}`` or ``{"ok": False, "error": "..."}``, and the
stream is closed. Each side reads the other's frame under the decode budget of the message it
expects (``swarm.budget``: the request type's, the reply envelope's), so a frame is refused
before it is built when it could not be that message. Frames are described in :mod:`swarm.framing`. Whatever a peer sends, the host
and its other streams keep running: garbage gets the stream reset, a bad message or a failing
handler gets an error envelope.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from swarm.budget import budget_for, envelope_budget
from swarm.dialing import Dialing
from swarm.errors import EndOfStream, FrameError, PeerUnreachable, RemoteError, SwarmTimeout, TruncatedFrame
from swarm.framing import read_frame, write_frame
from swarm.gate import RateLimited, refuse
from swarm.gate import StreamGate
from swarm.host_config import CLEANUP_TIMEOUT_S, MAX_ERROR_CHARS
from swarm.log_limit import LogLimit
from swarm.wire import Message, WireError

# Records keep the logger name of :mod:`swarm.host`, whose part of the host this is.
log = logging.getLogger("swarm.host")

R = TypeVar("R", bound=Message)
Q = TypeVar("Q", bound=Message)
Handler = Callable[[Any, str], Awaitable[Message]]


def _error_envelope(text: str) -> dict[str, Any]:
    return {"ok": False, "error": text[:MAX_ERROR_CHARS]}


async def _cleanup(stream: Any, *, reset: bool) -> None:
    """Close or reset a stream; shielded and bounded so it runs even while cancelled."""
    with trio.CancelScope(shield=True, deadline=trio.current_time() + CLEANUP_TIMEOUT_S):
        try:
            await (stream.reset() if reset else stream.close())
        except Exception as e:  # the stream is already gone: nothing left to do
            log.debug("stream cleanup failed: %s", e)


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


class RequestReply(Dialing):
    """``set_handler`` (server side) and ``request`` (client side), over the streams
    :class:`~swarm.dialing.Dialing` opens. Needs ``libp2p_host``, ``config`` and ``gate`` from
    :class:`swarm.host.SwarmHost`."""

    gate: StreamGate  # an annotation only: the host sets it

    @property
    def _log_limit(self) -> LogLimit:
        """This host's limit on log lines a peer's failing requests provoke (made on first use)."""
        limit = self.__dict__.get("_handler_log_limit")
        if limit is None:
            limit = self.__dict__["_handler_log_limit"] = LogLimit()
        return limit

    # ------------------------------------------------------------------ server side

    def set_handler(
        self, protocol_id: str, request_type: type[Q], handler: Callable[[Q, str], Awaitable[Message]],
        timeout_s: float | None = None,
    ) -> None:
        """Serve ``protocol_id``: each stream carries one ``request_type`` request and gets
        one reply, once the host's budgets admitted the stream (``self.gate``, :mod:`swarm.gate`). ``handler(msg, peer_id)`` returns the reply message within ``timeout_s``
        (default ``config.handler_timeout_s``)."""
        from libp2p.custom_types import TProtocol

        async def stream_handler(stream: Any) -> None:
            async def run(gated: Any) -> None:
                await self._serve(gated, protocol_id, request_type, handler, timeout_s)

            await self.gate.serve(stream, protocol_id, run)

        self.libp2p_host.set_stream_handler(TProtocol(protocol_id), stream_handler)

    async def _serve(self, stream: Any, protocol_id: str, request_type: type[Message], handler: Handler,
                     timeout_s: float | None = None) -> None:
        cfg = self.config
        try:
            peer = stream.muxed_conn.peer_id.to_base58()
        except Exception:
            peer = "?"
        try:
            try:
                raw = await read_frame(stream, max_size=cfg.max_frame_bytes, timeout=cfg.frame_timeout_s,
                                       budget=budget_for(request_type))
            except EndOfStream:
                await _cleanup(stream, reset=False)
                return
            except RateLimited as e:  # logged by the gate (rate-limited)
                await refuse(stream, str(e))
                return
            except (FrameError, SwarmTimeout) as e:
                log.warning("reset %s stream from %s: %s: %s", protocol_id, peer, type(e).__name__, e)
                await _cleanup(stream, reset=True)
                return
            envelope = await self._handle(raw, peer, protocol_id, request_type, handler, timeout_s)
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
        self, raw: Any, peer: str, protocol_id: str, request_type: type[Message], handler: Handler,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        try:
            request = request_type.from_wire(raw)
        except WireError as e:
            log.warning("rejected %s request from %s: %s", protocol_id, peer, e)
            return _error_envelope(f"invalid request: {e}")
        limit = self.config.handler_timeout_s if timeout_s is None else timeout_s
        reply: Any = None
        try:
            # move_on_after (not fail_after) so a TooSlowError raised *inside* the handler
            # is reported as the handler's own failure, not as our deadline.
            with trio.move_on_after(limit) as scope:
                reply = await handler(request, peer)
        except Exception as e:
            shown, held = self._log_limit.allow((protocol_id, peer, type(e).__name__))
            if shown:  # a peer that repeats a refused request is logged once a minute
                log.warning("%s handler failed for %s: %s: %s%s", protocol_id, peer, type(e).__name__, e,
                            f" (and {held} more since the last such line)" if held else "")
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
                    envelope = await read_frame(stream, max_size=cfg.max_frame_bytes, timeout=timeout,
                                                budget=envelope_budget(reply_type))
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
