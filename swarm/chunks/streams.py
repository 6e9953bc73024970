"""Closing a raw libp2p stream, whatever state it (or the task closing it) is in."""

from __future__ import annotations

import logging

import trio

log = logging.getLogger(__name__)

#: Longest wait (s) for a close or reset to go through.
CLOSE_TIMEOUT_S = 2.0


async def close_stream(stream, *, reset: bool, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
    """Close ``stream`` (``reset``: abort it, e.g. after a failure or bad data). Shielded from
    cancellation and bounded by ``timeout_s``, so it runs in ``finally`` blocks of cancelled
    tasks too; a stream that is already gone is ignored."""
    with trio.CancelScope(shield=True, deadline=trio.current_time() + timeout_s):
        try:
            await (stream.reset() if reset else stream.close())
        except Exception as e:
            log.debug("closing a stream failed: %s", e)
