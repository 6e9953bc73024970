"""Where the budgets of :mod:`swarm.limits` are enforced: every incoming stream of a
:class:`swarm.host.SwarmHost`, on every protocol, passes the host's :class:`StreamGate` before
its handler runs.

:meth:`StreamGate.admit` keys the stream by its connection, its peer id and the address block
of the connection's remote IP, and either refuses it (the peer gets one error envelope,
``{"ok": False, "error": "rate limited: ..."}``, and the stream is reset) or hands the handler a
:class:`GatedStream`: the same stream, whose reads are charged to the peer's and block's byte
budgets and whose frames' decoded memory is charged before they are built (``swarm.framing``
asks the stream, :meth:`GatedStream.charge_decoded`). A charge that is refused raises
:class:`RateLimited` (a :class:`~swarm.errors.FrameError`): the handler treats it as bad input
and resets the stream. Refusals are logged at most once per key and budget every
``LimitSettings.log_interval_s``. Charges may come from decode threads, so the gate locks.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import trio

from swarm.errors import FrameError
from swarm.limits import Limits, LimitSettings, Refusal, address_block

log = logging.getLogger(__name__)

#: Deadline (s) for writing a refusal's error envelope.
REFUSAL_WRITE_S = 2.0
#: How long (s) a refused stream stays open after its error envelope, for the peer to read it.
REFUSAL_LINGER_S = 0.5
#: Most refused streams lingering at once in a process (the rest are reset unanswered).
MAX_REFUSING = 64
#: How often (s) idle buckets are swept.
SWEEP_EVERY_S = 60.0


class RateLimited(FrameError):
    """A stream or a frame refused by the host's budgets (see :class:`swarm.limits.Refusal`)."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(str(refusal))
        self.refusal = refusal


def stream_keys(stream: Any) -> tuple[str, str, str]:
    """(connection, peer id, address block) of an incoming libp2p stream ("?" where unknown)."""
    from swarm.addrs import connection_remote_ip

    try:
        conn = stream.muxed_conn
        peer = conn.peer_id.to_base58()
    except Exception:
        return "?", "?", "?"
    return f"{id(conn):x}", peer, address_block(connection_remote_ip(_NetConn(conn)))


class _NetConn:
    """Adapts a muxed connection to what :func:`swarm.addrs.connection_remote_ip` reads."""

    def __init__(self, muxed_conn: Any) -> None:
        self.muxed_conn = muxed_conn


class StreamGate:
    """The budgets of one host, enforced (see the module)."""

    def __init__(self, settings: LimitSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = Limits(settings)
        self._clock = clock
        self._lock = threading.Lock()
        self._swept = clock()
        #: Refusals by budget (``Refusal.what``), for tests and benchmarks.
        self.refused: dict[str, int] = {}

    def _note(self, refusal: Refusal, protocol: str) -> None:
        self.refused[refusal.what] = self.refused.get(refusal.what, 0) + 1
        if self.limits.should_log(refusal, self._clock()):
            log.warning("refused %s from %s %s: %s (further refusals of this kind logged at most every %s s)",
                        protocol, refusal.scope, refusal.key, refusal, self.limits.settings.log_interval_s)

    def admit(self, stream: Any, protocol: str) -> "GatedStream | Refusal":
        """Admit an incoming stream (a :class:`GatedStream` to hand the handler, which must
        :meth:`GatedStream.release` it) or refuse it (the :class:`Refusal`, already logged)."""
        conn, peer, block = stream_keys(stream)
        with self._lock:
            now = self._clock()
            if now - self._swept > SWEEP_EVERY_S:
                self._swept = now
                self.limits.forget_idle(now)
            refusal = self.limits.open_stream(conn, peer, block, protocol, now)
            if refusal is not None:
                self._note(refusal, protocol)
                return refusal
        return GatedStream(stream, self, conn, peer, block, protocol)

    def _charge(self, kind: str, gs: "GatedStream", n: int) -> None:
        with self._lock:
            now = self._clock()
            if kind == "bytes":
                refusal = self.limits.charge_bytes(gs.peer, gs.block, n, now)
            elif kind == "decoded":
                refusal = self.limits.charge_decoded(gs.peer, gs.block, n, now)
            else:
                refusal = self.limits.request(gs.peer, gs.block, gs.protocol, now)
            if refusal is not None:
                self._note(refusal, gs.protocol)
        if refusal is not None:
            raise RateLimited(refusal)

    def _release(self, gs: "GatedStream") -> None:
        with self._lock:
            self.limits.close_stream(gs.conn, gs.peer, gs.block)

    async def serve(self, stream: Any, protocol: str, handler: Callable[[Any], Any]) -> None:
        """Run ``handler(gated_stream)`` if the stream is admitted, else answer the refusal."""
        admitted = self.admit(stream, protocol)
        if isinstance(admitted, Refusal):
            await refuse(stream, str(admitted))
            return
        try:
            await handler(admitted)
        finally:
            admitted.release()


_refusing = 0


async def refuse(stream: Any, text: str) -> None:
    """Answer a refused stream with one error envelope and close our side; after
    :data:`REFUSAL_LINGER_S` (time for the peer to read it: a reset drops data not yet read)
    reset it, so whatever the peer still sends is dropped, not buffered. At most
    :data:`MAX_REFUSING` refusals linger at once in a process; past that a stream is reset
    at once, unanswered. Never raises."""
    from swarm.framing import write_frame

    global _refusing
    with trio.CancelScope(shield=True), trio.move_on_after(REFUSAL_WRITE_S + REFUSAL_LINGER_S):
        if _refusing < MAX_REFUSING:
            _refusing += 1
            try:
                with trio.move_on_after(REFUSAL_WRITE_S):
                    await write_frame(stream, {"ok": False, "error": text}, timeout=REFUSAL_WRITE_S)
                    await stream.close()
                    await trio.sleep(REFUSAL_LINGER_S)
            except Exception as e:
                log.debug("could not send a refusal: %s", e)
            finally:
                _refusing -= 1
        try:
            await stream.reset()
        except Exception as e:
            log.debug("could not reset a refused stream: %s", e)
        drop_unread(getattr(stream, "stream", stream))


def drop_unread(stream: Any) -> int:
    """Forget what a peer sent on a stream we reset and did not read: py-libp2p's yamux keeps a
    reset stream's unread buffer (and keeps appending what still arrives, past the receive window)
    for a 60 s grace, so a peer whose frames are refused unread could keep about its sending rate
    times a minute in our memory. Returns the bytes dropped (0 where the stream is not yamux)."""
    try:
        muxed = stream.muxed_stream
        conn, sid = muxed.conn, muxed.stream_id
        buffers, streams, events = conn.stream_buffers, conn.streams, conn.stream_events
    except AttributeError:
        return 0
    if not getattr(muxed, "closed", False):
        return 0
    buffer = buffers.pop(sid, None)
    dropped = len(buffer) if buffer else 0
    if streams.get(sid) is muxed:
        streams.pop(sid, None)
    event = events.pop(sid, None)
    if event is not None:
        event.set()  # a reader still waiting (none should be) sees the stream gone
    return dropped


class GatedStream:
    """An admitted incoming stream: reads are charged to the peer's and block's byte budgets
    (a refused charge raises :class:`RateLimited`); everything else is the stream's own."""

    def __init__(self, stream: Any, gate: StreamGate, conn: str, peer: str, block: str, protocol: str) -> None:
        self.stream = stream
        self.gate = gate
        self.conn, self.peer, self.block, self.protocol = conn, peer, block, protocol
        self._released = False

    def __getattr__(self, name: str) -> Any:  # muxed_conn, get_protocol, ...
        return getattr(self.stream, name)

    async def read(self, n: int | None = None) -> bytes:
        data = await self.stream.read(n)
        if data:
            self.gate._charge("bytes", self, len(data))
        return data

    async def write(self, data: bytes) -> None:
        await self.stream.write(data)

    async def close(self) -> None:
        await self.stream.close()

    async def reset(self) -> None:
        try:
            await self.stream.reset()
        finally:
            drop_unread(self.stream)

    def charge_decoded(self, n: int) -> None:
        """A frame of this stream is about to decode into about ``n`` bytes of objects (called by
        ``swarm.framing`` before building them, maybe from a decode thread)."""
        self.gate._charge("decoded", self, n)

    def next_request(self) -> None:
        """One more request on this stream (a chunk stream's next request frame)."""
        self.gate._charge("request", self, 1)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.gate._release(self)
