"""Bytes of incoming frame bodies held at once: a process-wide and a per-peer budget, taken before a
body is read and given back once it is decoded (``swarm.framing.read_frame``, for incoming streams).

Each frame is bounded by its decode budget, and each peer by the host's rates (``swarm.limits``),
but many streams each reading a big frame slowly would still hold all their bodies at once. A
reader waits (within its frame deadline) until the body fits: at most :data:`GLOBAL_BYTES` in the
process and :data:`PEER_BYTES` per peer; a body bigger than a budget passes when nothing else is
held under it, so an honest big frame (a stage's hidden states) is delayed, never refused.
:class:`InFlight` is the decision plus the wake-ups; the event loop holds one per trio run.
"""

from __future__ import annotations

import trio

from swarm.changes import Changes

#: Most bytes of incoming frame bodies held at once in a process.
GLOBAL_BYTES = 256 * 1024 * 1024
#: Most bytes of incoming frame bodies held at once for one peer.
PEER_BYTES = 64 * 1024 * 1024


def fits(held: int, n: int, cap: int) -> bool:
    """Whether ``n`` more bytes may be held next to ``held`` under ``cap`` (one oversized body
    alone always fits)."""
    return held == 0 or held + n <= cap


class InFlight:
    """Bytes held by frame bodies being read or decoded, in all and per peer (trio thread only)."""

    def __init__(self, global_bytes: int = GLOBAL_BYTES, peer_bytes: int = PEER_BYTES) -> None:
        self.global_bytes, self.peer_bytes = global_bytes, peer_bytes
        self.held = 0
        self.by_peer: dict[str, int] = {}
        self._released = Changes()

    async def acquire(self, peer: str, n: int) -> None:
        """Wait until ``n`` bytes fit for ``peer``, then hold them (cancellable: nothing is held then)."""
        while not (fits(self.held, n, self.global_bytes) and fits(self.by_peer.get(peer, 0), n, self.peer_bytes)):
            await self._released.wait()
        self.held += n
        self.by_peer[peer] = self.by_peer.get(peer, 0) + n

    def release(self, peer: str, n: int) -> None:
        self.held -= n
        left = self.by_peer.get(peer, 0) - n
        if left > 0:
            self.by_peer[peer] = left
        else:
            self.by_peer.pop(peer, None)
        self._released.notify()  # every waiter re-checks


_RUN_INFLIGHT: trio.lowlevel.RunVar = trio.lowlevel.RunVar("swarm_inflight_bodies")


def inflight() -> InFlight:
    """This trio run's :class:`InFlight`."""
    try:
        return _RUN_INFLIGHT.get()
    except LookupError:
        value = InFlight()
        _RUN_INFLIGHT.set(value)
        return value
