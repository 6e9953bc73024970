"""When a node may generate: its daily hours (``--hours 22-7``), the owner's pause
(``swarm-node pause``) and the battery (``--pause-on-battery``), decided by pure functions of
what the machine reports; :mod:`node_agents.pause_gate` reads the machine and asks them.

A window is ``START-END`` in local time, hours (``22-7``) or hours and minutes
(``22:30-06:45``); it wraps past midnight when END is not after START (``22-7``: from 22:00
until 07:00 the next morning). ``0-24`` and the empty window mean always. START is inside the
window, END is not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Minutes in a day.
DAY_MIN = 24 * 60

_TIME = r"(\d{1,2})(?::(\d{2}))?"


@dataclass(frozen=True)
class Hours:
    """A daily window: minutes after local midnight ``[start, end)``; ``start == end``: always."""

    start: int = 0
    end: int = 0

    @property
    def always(self) -> bool:
        return self.start == self.end

    def __str__(self) -> str:
        if self.always:
            return "always"
        return f"{_hhmm(self.start)}-{_hhmm(self.end)}"


def _hhmm(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def parse_hours(text: str) -> Hours:
    """``Hours`` from ``22-7``, ``22:30-06:45``, ``9-17`` or ``0-24``; empty = always.
    ``ValueError`` (saying what is expected) on anything else."""
    text = text.strip()
    if not text:
        return Hours()
    m = re.fullmatch(rf"{_TIME}\s*-\s*{_TIME}", text)
    if not m:
        raise ValueError(f"hours {text!r}: expected START-END in local time, e.g. 22-7 or 22:30-06:45")
    ends = []
    for h, mm in ((m.group(1), m.group(2)), (m.group(3), m.group(4))):
        hour, minute = int(h), int(mm or 0)
        if hour > 24 or minute > 59 or (hour == 24 and minute):
            raise ValueError(f"hours {text!r}: {h}{':' + mm if mm else ''} is not a time of day (00:00 to 24:00)")
        ends.append(hour * 60 + minute)
    if ends[1] - ends[0] == DAY_MIN:  # 0-24
        return Hours()
    start, end = ends[0] % DAY_MIN, ends[1] % DAY_MIN
    if start == end:
        raise ValueError(f"hours {text!r}: START and END are the same time (0-24 means always)")
    return Hours(start, end)


def minute_of_day(hour: int, minute: int) -> int:
    return (hour * 60 + minute) % DAY_MIN


def in_hours(hours: Hours, minute: int) -> bool:
    """Whether local time ``minute`` (minutes after midnight) lies in the window."""
    if hours.always:
        return True
    if hours.start < hours.end:
        return hours.start <= minute < hours.end
    return minute >= hours.start or minute < hours.end  # wraps past midnight


def minutes_until_open(hours: Hours, minute: int) -> int:
    """Minutes from ``minute`` until the window opens (0 inside it)."""
    if in_hours(hours, minute):
        return 0
    return (hours.start - minute) % DAY_MIN


@dataclass(frozen=True)
class Power:
    """What the machine says of its power: ``on_battery`` None = could not tell (no battery
    found or no tool to ask), treated as mains; ``percent`` of the battery, None if unknown."""

    on_battery: bool | None
    percent: float | None = None
    #: Where it came from, for messages (``sysfs``, ``pmset``, ``none``).
    source: str = "none"


def pause_reason(*, paused_by_owner: str | None, pause_on_battery: bool, power: Power, hours: Hours,
                 minute: int) -> str | None:
    """Why the node must not start new work now (None: it may). The owner's pause first, then
    the battery, then the hours window."""
    if paused_by_owner is not None:
        return f"paused by the owner{' (' + paused_by_owner + ')' if paused_by_owner else ''}: swarm-node resume"
    if pause_on_battery and power.on_battery:
        pct = f" at {power.percent:.0f}%" if power.percent is not None else ""
        return f"on battery{pct} (--pause-on-battery): waiting for mains power"
    if not in_hours(hours, minute):
        wait = minutes_until_open(hours, minute)
        return f"outside the hours {hours} (--hours): resuming at {_hhmm(hours.start)} (in {wait // 60}h{wait % 60:02d})"
    return None
