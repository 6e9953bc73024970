"""The daily hours window and the pause decision (``node_agents/schedule.py``): pure functions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node_agents.schedule import DAY_MIN, Hours, Power, in_hours, minute_of_day, minutes_until_open, parse_hours, \
    pause_reason


def at(h: int, m: int = 0) -> int:
    return minute_of_day(h, m)


@pytest.mark.parametrize("text, start, end", [
    ("22-7", 22 * 60, 7 * 60), ("9-17", 9 * 60, 17 * 60), ("22:30-06:45", 22 * 60 + 30, 6 * 60 + 45),
    (" 9 - 17 ", 9 * 60, 17 * 60), ("24-7", 0, 7 * 60), ("0-24", 0, 0), ("", 0, 0), ("18-24", 18 * 60, 0),
])
def test_parse_hours(text, start, end):
    assert parse_hours(text) == Hours(start, end)


@pytest.mark.parametrize("text, why", [
    ("7-7", "same time"), ("25-3", "25 is not a time of day"), ("22-7:60", "7:60 is not a time of day"),
    ("24:30-1", "not a time of day"), ("22", "expected START-END"), ("night", "expected START-END"),
    ("-3-4", "expected START-END"),
])
def test_bad_hours_say_what_is_expected(text, why):
    with pytest.raises(ValueError, match=why):
        parse_hours(text)


def test_window_that_wraps_past_midnight():
    night = parse_hours("22-7")
    assert [in_hours(night, at(h)) for h in (21, 22, 23, 0, 3, 6)] == [False, True, True, True, True, True]
    assert not in_hours(night, at(7)) and in_hours(night, at(6, 59)) and not in_hours(night, at(21, 59))
    assert minutes_until_open(night, at(21, 30)) == 30
    assert minutes_until_open(night, at(7)) == 15 * 60
    assert minutes_until_open(night, at(1)) == 0


def test_daytime_window_and_always():
    day = parse_hours("9:30-17")
    assert not in_hours(day, at(9, 29)) and in_hours(day, at(9, 30)) and in_hours(day, at(16, 59))
    assert not in_hours(day, at(17)) and minutes_until_open(day, at(17)) == 16 * 60 + 30
    assert all(in_hours(parse_hours("0-24"), m) for m in range(0, DAY_MIN, 7))
    assert str(day) == "09:30-17:00" and str(Hours()) == "always"


@given(st.integers(0, DAY_MIN - 1), st.integers(0, DAY_MIN - 1), st.integers(0, DAY_MIN - 1))
def test_a_window_and_its_complement_split_the_day(start, end, minute):
    if start == end:
        return
    assert in_hours(Hours(start, end), minute) != in_hours(Hours(end, start), minute)
    wait = minutes_until_open(Hours(start, end), minute)
    assert 0 <= wait < DAY_MIN and in_hours(Hours(start, end), (minute + wait) % DAY_MIN)
    assert wait == 0 or not in_hours(Hours(start, end), (minute + wait - 1) % DAY_MIN)


MAINS, BATTERY = Power(on_battery=False), Power(on_battery=True, percent=41.0)


def test_pause_reasons_in_order():
    night = parse_hours("22-7")
    kw = dict(pause_on_battery=True, hours=night)
    assert pause_reason(paused_by_owner=None, power=MAINS, minute=at(23), **kw) is None
    assert "owner (gaming): swarm-node resume" in pause_reason(paused_by_owner="gaming", power=BATTERY, minute=at(12),
                                                               **kw)
    assert pause_reason(paused_by_owner="", power=MAINS, minute=at(23), **kw).startswith("paused by the owner:")
    assert "on battery at 41%" in pause_reason(paused_by_owner=None, power=BATTERY, minute=at(23), **kw)
    why = pause_reason(paused_by_owner=None, power=MAINS, minute=at(20, 15), **kw)
    assert "outside the hours 22:00-07:00" in why and "resuming at 22:00 (in 1h45)" in why


def test_battery_is_ignored_unless_asked_and_unknown_power_is_mains():
    kw = dict(paused_by_owner=None, hours=Hours(), minute=at(12))
    assert pause_reason(pause_on_battery=False, power=BATTERY, **kw) is None
    assert pause_reason(pause_on_battery=True, power=Power(on_battery=None), **kw) is None
