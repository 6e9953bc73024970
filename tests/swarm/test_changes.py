"""``swarm.changes.Changes``: one notify wakes every waiter; a waiter that was busy can tell it
missed a notification (``wait_since``)."""

from __future__ import annotations

import trio
import trio.testing

from swarm.changes import Changes


def test_notify_wakes_every_waiter_once():
    async def main():
        changes, woke = Changes(), []

        async def waiter(i: int) -> None:
            await changes.wait()
            woke.append(i)

        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(waiter, i)
            await trio.testing.wait_all_tasks_blocked()
            assert woke == []
            changes.notify()
        assert sorted(woke) == [0, 1, 2] and changes.count == 1

    trio.run(main)


def test_a_notification_while_busy_is_not_lost_with_wait_since():
    async def main():
        changes = Changes()
        seen = changes.count
        changes.notify()  # while the waiter was busy elsewhere
        with trio.fail_after(1):
            assert await changes.wait_since(seen) == 1  # returns at once
        with trio.move_on_after(0.05) as scope:
            await changes.wait_since(1)  # nothing new: waits
        assert scope.cancelled_caught

    trio.run(main)
