"""One wake-up signal for everything that waits on a part's state: a new lease to hand out, a
push accepted, a chunk arrived, a version stored, a slot released, the routing table grown.

The pattern it replaces, written out by hand in each part, was ``event.set(); event =
trio.Event()`` on one side and ``while not condition: await event.wait()`` on the other.
"""

from __future__ import annotations

import trio


class Changes:
    """:meth:`notify` wakes every task in :meth:`wait` (an edge, not a level: a waiter re-checks
    its own condition after waking). :attr:`count` counts the notifications, so a waiter that was
    busy in between can tell it missed one (:meth:`wait_since`)."""

    def __init__(self) -> None:
        self._event = trio.Event()
        #: Notifications so far.
        self.count = 0

    def notify(self) -> None:
        self.count += 1
        self._event.set()
        self._event = trio.Event()

    async def wait(self) -> None:
        """Until the next :meth:`notify`."""
        await self._event.wait()

    async def wait_since(self, seen: int) -> int:
        """At once when :meth:`notify` was called since :attr:`count` was ``seen``, else until the
        next one; returns the count now."""
        if self.count == seen:
            await self._event.wait()
        return self.count
