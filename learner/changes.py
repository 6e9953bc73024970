"""One wake-up signal for everything that waits on the learner's state: a new lease to hand
out, a push accepted, a verification passed, a new adapter version, the end of the run."""

from __future__ import annotations

import trio


class Changes:
    """:meth:`notify` wakes every task in :meth:`wait` (an edge, not a level: a waiter re-checks
    its own condition after waking)."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def wait(self) -> None:
        await self._event.wait()
