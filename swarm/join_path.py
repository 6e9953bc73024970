"""The connection path of a :class:`swarm.host.SwarmHost` under many simultaneous joins: libp2p
connection limits and negotiation deadlines from :class:`swarm.host.HostConfig`, pacing of inbound
handshakes, optional automatic identify, and the retry delay of a peer that could not join.

Why (measured with ``swarm-bench load``, 200 hosts against one learner on 2 busy cores): a join
costs the learner about 13 ms of CPU (TCP, multistream-select, Noise XX, Yamux, identify both
ways, hello), a request about 3 ms. Once the learner's single trio thread is saturated, every
round trip of a handshake waits for a full pass over the runnable tasks, so a handshake of about
ten round trips can take longer than py-libp2p's 10 s upgrade and negotiation deadlines; the peer
gives up, the learner's share of that handshake is wasted and the retry adds to the queue. Three
things keep joins going through:

- **deadlines** for upgrades and stream negotiation taken from ``HostConfig.negotiate_timeout_s``
  (py-libp2p: 10 s for upgrades, 30 s for multistream elsewhere), so slowness is not failure;
- **pacing**: at most ``HostConfig.max_concurrent_handshakes`` inbound upgrades run at once, the
  rest wait (their TCP connection accepted, their first bytes buffered) instead of interleaving
  their round trips with each other, so each admitted handshake finishes quickly and in order;
- **retry without giving up** while the peer is alive (:func:`retry_delay_s`,
  :func:`is_alive_failure`): a handshake that timed out means a busy peer, not a dead one.

py-libp2p 0.8's defaults also prune connections above 200 (``high_watermark``) and refuse them
above 300: a learner with a few hundred nodes would drop idle nodes' connections. The limits here
come from ``HostConfig.max_connections``.

py-libp2p 0.8.1 also holds each inbound connection's slot of its inbound cap (``max_connections -
min_connections``) until the whole host stops, not until the connection ends: its inbound handler
waits for the swarm's end. Measured: after 947 hellos from fresh peer ids (each connecting once
and leaving), every further inbound connection was refused, an honest newcomer's too.
:func:`free_inbound_slot_on_close` makes the handler end with its connection, giving the slot
back (and the handler's task: one per connection ever made was parked until shutdown). Measured
with ``tests/swarm/test_inbound_slots.py``: 10 inbound slots, the 11th fresh peer id was refused.
"""

from __future__ import annotations

import contextvars
import logging
from typing import Any

import trio

log = logging.getLogger(__name__)

#: Connections below which py-libp2p's auto-connector dials known peers (py-libp2p: 100, with
#: ``min_connections`` 50). Kept at py-libp2p's values unless ``max_connections`` is smaller.
LOW_WATERMARK = 100
MIN_CONNECTIONS = 50
#: Fraction of ``max_connections`` above which idle connections are pruned (towards the low mark).
HIGH_WATERMARK_FRACTION = 0.9


def connection_config(cfg: Any) -> Any:
    """py-libp2p ``ConnectionConfig`` for a :class:`swarm.host.HostConfig`: connection limits from
    ``max_connections``, upgrade and stream negotiation deadlines from ``negotiate_timeout_s``,
    the dial deadline from ``dial_timeout_s``."""
    from libp2p.network.config import ConnectionConfig

    n = int(cfg.max_connections)
    low = min(LOW_WATERMARK, n)
    t = float(cfg.negotiate_timeout_s)
    return ConnectionConfig(
        max_connections=n,
        min_connections=min(MIN_CONNECTIONS, low),
        low_watermark=low,
        high_watermark=max(low, int(HIGH_WATERMARK_FRACTION * n)),
        dial_timeout=float(cfg.dial_timeout_s),
        inbound_upgrade_timeout=t,
        outbound_upgrade_timeout=t,
        inbound_stream_protocol_negotiation_timeout=t,
        outbound_stream_protocol_negotiation_timeout=t,
    )


def pace_inbound_handshakes(libp2p_host: Any, limit: int) -> trio.CapacityLimiter | None:
    """Let at most ``limit`` inbound connection upgrades (security + muxer negotiation) run at
    once on ``libp2p_host``; the others wait their turn. Returns the limiter (None: no limit).

    py-libp2p runs every accepted connection's upgrade concurrently in the same trio thread; the
    upgrade deadline (``inbound_upgrade_timeout``) starts once the slot is held, so a waiting
    connection is not timed out by its own side."""
    if limit <= 0:
        return None
    network = libp2p_host.get_network()
    upgrade = network.upgrade_inbound_raw_conn
    limiter = trio.CapacityLimiter(limit)

    async def paced_upgrade(raw_conn: Any, maddr: Any) -> Any:
        async with limiter:
            return await upgrade(raw_conn, maddr)

    network.upgrade_inbound_raw_conn = paced_upgrade
    return limiter


class _Inbound:
    """The connection one listener handler upgraded (set by the upgrade, watched by the handler)."""

    def __init__(self) -> None:
        self.ready = trio.Event()
        self.closed: trio.Event | None = None


#: The handler task of one accepted connection's :class:`_Inbound` (hole punches and relayed
#: connections use the same upgrade from other tasks, where it is None).
_INBOUND: contextvars.ContextVar[_Inbound | None] = contextvars.ContextVar("inbound_conn", default=None)


def free_inbound_slot_on_close(libp2p_host: Any) -> None:
    """End the handler of every connection ``libp2p_host``'s listeners accept when the connection
    ends (see the module), so its inbound slot is given back: the host's upgrade notes the
    multiplexed connection it made for that handler, and the handler is cancelled (py-libp2p's
    ``finally`` releases the slot) once the connection's ``event_closed`` is set (Yamux sets it
    when either side closes or the transport fails)."""
    network = libp2p_host.get_network()
    upgrade, handle = network.upgrade_inbound_raw_conn, network._do_handle_inbound_connection

    async def upgrade_noted(raw_conn: Any, maddr: Any) -> Any:
        muxed = await upgrade(raw_conn, maddr)
        inbound = _INBOUND.get()
        closed = getattr(muxed, "event_closed", None)  # a py-libp2p object, not ours
        if inbound is not None and isinstance(closed, trio.Event):
            inbound.closed = closed
            inbound.ready.set()
        return muxed

    async def handle_until_closed(*args: Any) -> None:
        inbound = _Inbound()
        token = _INBOUND.set(inbound)
        try:
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    async def watch() -> None:
                        await inbound.ready.wait()
                        assert inbound.closed is not None
                        await inbound.closed.wait()
                        scope.cancel()  # the connection ended: so does its handler

                    nursery.start_soon(watch)
                    await handle(*args)  # returns at once when the upgrade failed
                    scope.cancel()
        finally:
            _INBOUND.reset(token)

    network._do_handle_inbound_connection = handle_until_closed
    network.upgrade_inbound_raw_conn = upgrade_noted


def disable_auto_identify(libp2p_host: Any) -> None:
    """Do not run identify towards every new connection's peer (py-libp2p does, both ways, on
    every connection). The host still answers identify requests. For hosts that need neither the
    peer's protocol list nor its addresses from identify (simulated nodes; not a DHT member)."""
    network = libp2p_host.get_network()
    network.notifees = [n for n in network.notifees if type(n).__name__ != "_IdentifyNotifee"]
    libp2p_host._schedule_identify = lambda peer_id, *, reason: None


#: Texts (in an error or its causes) of a join that found nobody there: nothing accepted the TCP
#: connection (py-libp2p: "fail to open connection to peer"), or the address itself is bad.
ABSENT_PEER_TEXTS = ("fail to open connection to peer", "no known addresses", "bad peer address", "bad peer id")


def _texts(exc: BaseException | None, depth: int = 0) -> list[str]:
    out: list[str] = []
    while exc is not None and depth < 16:
        out.append(str(exc).lower())
        for sub in getattr(exc, "exceptions", None) or ():
            if isinstance(sub, BaseException):
                out.extend(_texts(sub, depth + 1))
        exc, depth = exc.__cause__ or exc.__context__, depth + 1
    return out


def is_alive_failure(exc: BaseException) -> bool:
    """Whether a failed join attempt shows a peer that is up but busy (a deadline passed, a
    handshake or stream broke midway) rather than absent (nothing accepted the TCP connection,
    or the address is bad). A black-holed address also times out: it counts as busy."""
    return not any(t in text for text in _texts(exc) for t in ABSENT_PEER_TEXTS)


def retry_delay_s(attempt: int, u: float, base_s: float = 0.5, cap_s: float = 10.0) -> float:
    """Delay before join attempt ``attempt + 1`` (``attempt`` counts from 0): "full jitter"
    exponential backoff, uniform in ``[0, min(cap_s, base_s * 2**attempt))`` with ``u`` uniform in
    [0, 1). Jitter spreads the retries of peers that failed together, so they do not return
    together."""
    if attempt < 0 or not 0.0 <= u < 1.0:
        raise ValueError(f"attempt >= 0 and 0 <= u < 1 required, got {attempt}, {u}")
    return u * min(cap_s, base_s * 2.0 ** min(attempt, 60))
