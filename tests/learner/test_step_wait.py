"""The learner's batch wait tops the group supply up at every change (learner/steps.py)."""

from __future__ import annotations

import trio

from learner.roster import NodeRoster
from learner.steps import _wait_ready


class _Service:
    def __init__(self) -> None:
        self.changed = trio.Event()
        self.roster = NodeRoster()

    async def wait_changed(self) -> None:
        await self.changed.wait()
        self.changed = trio.Event()


class _Ctx:
    def __init__(self) -> None:
        self.service = _Service()
        self.console = print


def test_refill_runs_before_every_readiness_check():
    """A group dropped as stale during the wait is replaced at the next change: without the
    refill, ``ready`` would never hold and the wait would hang (the test's deadline fails)."""
    ctx = _Ctx()
    supply = {"in_flight": 4, "ready": 0, "refills": 0}
    target = 4

    def refill() -> None:
        supply["refills"] += 1
        supply["in_flight"] = 4  # what top_up does: back to the in-flight limit

    async def nodes() -> None:
        for arrival in range(6):
            await trio.sleep(0.01)
            if arrival % 2 == 0:  # stale on arrival: dropped, leaves the supply
                supply["in_flight"] -= 1
            else:
                supply["ready"] += 1
                supply["in_flight"] -= 1
            ctx.service.changed.set()
            if supply["ready"] >= target:
                return
            if supply["in_flight"] == 0:  # nothing left to generate: only a refill helps
                return

    async def main() -> None:
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(nodes)
                await _wait_ready(ctx, lambda: supply["ready"] >= 3, lambda: "", refill)

    trio.run(main)
    assert supply["ready"] >= 3
    assert supply["refills"] >= 4  # before the first check and after every change
