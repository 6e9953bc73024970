"""Battery detection (``node_agents/power.py``) over reports in the formats Linux and macOS give:
``/sys/class/power_supply/*/uevent`` (the kernel's ``POWER_SUPPLY_*`` properties) and ``pmset -g batt``."""

from __future__ import annotations

import pytest

from node_agents.power import parse_uevent, power_from_pmset, power_from_sysfs, read_power, read_sysfs

# A laptop: the AC adapter and its battery, as uevent files.
AC_ON = "POWER_SUPPLY_NAME=AC\nPOWER_SUPPLY_TYPE=Mains\nPOWER_SUPPLY_ONLINE=1\n"
AC_OFF = "POWER_SUPPLY_NAME=AC\nPOWER_SUPPLY_TYPE=Mains\nPOWER_SUPPLY_ONLINE=0\n"
BAT = ("POWER_SUPPLY_NAME=BAT0\nPOWER_SUPPLY_TYPE=Battery\nPOWER_SUPPLY_STATUS={status}\nPOWER_SUPPLY_PRESENT=1\n"
       "POWER_SUPPLY_TECHNOLOGY=Li-ion\nPOWER_SUPPLY_CAPACITY={capacity}\nPOWER_SUPPLY_CAPACITY_LEVEL=Normal\n"
       "POWER_SUPPLY_MODEL_NAME=5B10W13975\nPOWER_SUPPLY_MANUFACTURER=SMP\n")
# A wireless mouse's battery: a peripheral (scope Device), not the machine's.
MOUSE = ("POWER_SUPPLY_NAME=hidpp_battery_0\nPOWER_SUPPLY_TYPE=Battery\nPOWER_SUPPLY_SCOPE=Device\n"
         "POWER_SUPPLY_STATUS=Discharging\nPOWER_SUPPLY_ONLINE=1\nPOWER_SUPPLY_CAPACITY=30\n")
# A USB-C port's power delivery (off while the barrel charger or nothing is connected).
USBC = "POWER_SUPPLY_NAME=ucsi-source-psy-USBC000:001\nPOWER_SUPPLY_TYPE=USB\nPOWER_SUPPLY_ONLINE={online}\n" \
       "POWER_SUPPLY_USB_TYPE=C [PD] PD_PPS\n"


def supplies(**files: str) -> dict:
    return {name: parse_uevent(text) for name, text in files.items()}


def test_uevent_lines():
    assert parse_uevent(AC_ON) == {"NAME": "AC", "TYPE": "Mains", "ONLINE": "1"}
    assert parse_uevent("garbage\nPOWER_SUPPLY_X=a=b\n") == {"X": "a=b"}


@pytest.mark.parametrize("files, on_battery, percent", [
    ({"AC": AC_ON, "BAT0": BAT.format(status="Charging", capacity=80)}, False, 80.0),
    ({"AC": AC_OFF, "BAT0": BAT.format(status="Discharging", capacity=57)}, True, 57.0),
    ({"AC": AC_ON, "BAT0": BAT.format(status="Not charging", capacity=100)}, False, 100.0),
    # the adapter is listed offline: on battery whatever the battery says
    ({"AC": AC_OFF, "BAT0": BAT.format(status="Unknown", capacity=99)}, True, 99.0),
    # no charger listed at all: the battery's own state decides
    ({"BAT0": BAT.format(status="Discharging", capacity=12)}, True, 12.0),
    ({"BAT0": BAT.format(status="Full", capacity=100)}, False, 100.0),
    ({"BAT0": BAT.format(status="Unknown", capacity=50)}, None, 50.0),
    # charging over USB-C power delivery, the barrel adapter offline
    ({"AC": AC_OFF, "USBC": USBC.format(online=1), "BAT0": BAT.format(status="Charging", capacity=63)}, False, 63.0),
    ({"AC": AC_OFF, "USBC": USBC.format(online=0), "BAT0": BAT.format(status="Discharging", capacity=63)}, True, 63.0),
    # a desktop with a wireless mouse: no battery of its own
    ({"hidpp_battery_0": MOUSE}, False, None),
    ({}, False, None),
])
def test_sysfs(files, on_battery, percent):
    p = power_from_sysfs(supplies(**files))
    assert (p.on_battery, p.percent, p.source) == (on_battery, percent, "sysfs")


PMSET_AC = ("Now drawing from 'AC Power'\n -InternalBattery-0 (id=4653155)\t100%; charged; 0:00 remaining present: true\n")
PMSET_BAT = ("Now drawing from 'Battery Power'\n"
             " -InternalBattery-0 (id=4653155)\t85%; discharging; 4:52 remaining present: true\n")
PMSET_DESKTOP = "Now drawing from 'AC Power'\n"
PMSET_UPS = "Now drawing from 'UPS Power'\n -Back-UPS ES 700 (id=1234)\t96%; discharging; (no estimate)\n"


@pytest.mark.parametrize("text, on_battery, percent", [
    (PMSET_AC, False, 100.0), (PMSET_BAT, True, 85.0), (PMSET_DESKTOP, False, None), (PMSET_UPS, True, 96.0),
    ("", None, None), ("pmset: command failed", None, None),
])
def test_pmset(text, on_battery, percent):
    p = power_from_pmset(text)
    assert (p.on_battery, p.percent, p.source) == (on_battery, percent, "pmset")


def test_read_sysfs_tree(tmp_path):
    for name, text in {"AC": AC_OFF, "BAT0": BAT.format(status="Discharging", capacity=33)}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "uevent").write_text(text)
    (tmp_path / "broken").mkdir()  # no uevent: skipped
    found = read_sysfs(tmp_path)
    assert sorted(found) == ["AC", "BAT0"]
    assert power_from_sysfs(found).on_battery is True
    assert read_sysfs(tmp_path / "missing") == {}


def test_this_machine_and_other_systems_answer():
    assert read_power("Linux").source == "sysfs"  # whatever this machine has, it reads without error
    assert read_power("Windows").on_battery is None
