"""The node's pause gate: before each new lease the agent waits here while the node must not
work (the owner's ``swarm-node pause``, ``--pause-on-battery`` on battery, outside ``--hours``).

A pause never cuts work in hand: it takes effect between leases, so the lease being generated is
finished and pushed, and no pushed group is lost; the learner simply hands the node no more work
until it asks again. The decision is :func:`node_agents.schedule.pause_reason`; this module only
reads its inputs (the pause file, the power source, the local time) every ``check_s`` seconds
while paused (cross-process state: nothing to wait on but the files).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import trio

from node_agents import control
from node_agents.power import read_power
from node_agents.record import NodeRecord
from node_agents.schedule import Hours, Power, minute_of_day, pause_reason

#: How often a paused node looks again (s).
CHECK_S = 2.0
#: How long a power reading is reused (s): ``pmset`` is a process.
POWER_TTL_S = 15.0


def local_minute() -> int:
    t = time.localtime()
    return minute_of_day(t.tm_hour, t.tm_min)


class PauseGate:
    """``await gate.wait_allowed()`` returns once the node may take new work; while it waits it
    says why (once per change of reason) and records the state."""

    def __init__(self, data_dir: Path, hours: Hours, pause_on_battery: bool, say: Callable[[str], None],
                 record: NodeRecord | None = None, power: Callable[[], Power] = read_power,
                 minute: Callable[[], int] = local_minute, check_s: float = CHECK_S) -> None:
        self.data_dir = Path(data_dir)
        self.hours = hours
        self.pause_on_battery = pause_on_battery
        self.say = say
        self.record = record
        self.power = power
        self.minute = minute
        self.check_s = check_s
        self._power: tuple[float, Power] | None = None
        #: Seconds spent paused over the node's life.
        self.paused_s = 0.0

    def _read_power(self) -> Power:
        if not self.pause_on_battery:
            return Power(on_battery=None)
        now = time.monotonic()
        if self._power is None or now - self._power[0] > POWER_TTL_S:
            self._power = (now, self.power())
        return self._power[1]

    def reason(self) -> str | None:
        """Why the node must not start work now (None: it may)."""
        return pause_reason(paused_by_owner=control.owner_pause(self.data_dir), pause_on_battery=self.pause_on_battery,
                            power=self._read_power(), hours=self.hours, minute=self.minute())

    async def wait_allowed(self) -> None:
        why = await trio.to_thread.run_sync(self.reason)
        if why is None:
            return
        t0, said = time.monotonic(), None
        while why is not None:
            if why != said:
                self.say(f"paused: {why}")
                if self.record is not None:
                    self.record.state("paused", why)
                said = why
            await trio.sleep(self.check_s)
            why = await trio.to_thread.run_sync(self.reason)
        waited = time.monotonic() - t0
        self.paused_s += waited
        self.say(f"resumed after {waited:.0f}s paused")
        if self.record is not None:
            self.record.state("working", "")
