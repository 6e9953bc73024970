"""Is the machine on battery? Pure parsers of what the OS reports, and thin readers around them.

- Linux: ``/sys/class/power_supply/<name>/uevent`` (``POWER_SUPPLY_TYPE``, ``_ONLINE``,
  ``_STATUS``, ``_CAPACITY``, ``_SCOPE``); :func:`power_from_sysfs` decides from those maps.
- macOS: ``pmset -g batt`` (``Now drawing from 'Battery Power'``); :func:`power_from_pmset`.
- Elsewhere, or when the report cannot be read: unknown (``on_battery=None``, treated as mains).
"""

from __future__ import annotations

import logging
import platform
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

from node_agents.schedule import Power

log = logging.getLogger("echo_swarm.node")

#: Where Linux lists its power supplies.
SYSFS_POWER = Path("/sys/class/power_supply")
#: Longest wait for ``pmset`` (s).
PMSET_TIMEOUT_S = 5.0
#: Battery states that mean the charger is connected.
_PLUGGED_STATES = {"charging", "full", "not charging"}


def parse_uevent(text: str) -> dict[str, str]:
    """``POWER_SUPPLY_X=value`` lines as ``{"X": value}``."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.startswith("POWER_SUPPLY_"):
            out[key[len("POWER_SUPPLY_"):]] = value.strip()
    return out


def power_from_sysfs(supplies: Mapping[str, Mapping[str, str]]) -> Power:
    """From Linux's power supplies (name -> :func:`parse_uevent` map). Peripherals' batteries
    (``SCOPE=Device``: a mouse, a headset) do not count. No system battery: mains. A mains-type
    supply (``Mains``, ``USB``, ...) online: mains; mains-type supplies all offline, or a battery
    discharging with none listed: on battery."""
    batteries: list[Mapping[str, str]] = []
    mains: list[Mapping[str, str]] = []
    for props in supplies.values():
        if props.get("SCOPE", "").lower() == "device":
            continue
        (batteries if props.get("TYPE", "").lower() == "battery" else mains).append(props)
    if not batteries:
        return Power(on_battery=False, source="sysfs")
    percent = _percent(batteries[0].get("CAPACITY"))
    if any(m.get("ONLINE") == "1" for m in mains):
        return Power(on_battery=False, percent=percent, source="sysfs")
    states = {b.get("STATUS", "").lower() for b in batteries}
    if mains:  # a charger is listed and none is online
        return Power(on_battery=True, percent=percent, source="sysfs")
    if states & _PLUGGED_STATES:
        return Power(on_battery=False, percent=percent, source="sysfs")
    if "discharging" in states:
        return Power(on_battery=True, percent=percent, source="sysfs")
    return Power(on_battery=None, percent=percent, source="sysfs")


def _percent(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and 0.0 <= value <= 100.0 else None


def power_from_pmset(text: str) -> Power:
    """From ``pmset -g batt``: ``Now drawing from 'AC Power'`` / ``'Battery Power'`` (a UPS counts
    as battery), and the first ``NN%`` of its battery lines."""
    m = re.search(r"drawing from '([^']+)'", text)
    if not m:
        return Power(on_battery=None, source="pmset")
    pct = re.search(r"\t(\d{1,3})%;", text) or re.search(r"(\d{1,3})%;", text)
    return Power(on_battery=m.group(1).strip().lower() != "ac power", percent=_percent(pct.group(1) if pct else None),
                 source="pmset")


def read_sysfs(root: Path = SYSFS_POWER) -> dict[str, dict[str, str]]:
    """Every supply's uevent under ``root`` (empty when there is none or it cannot be read)."""
    out: dict[str, dict[str, str]] = {}
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return out
    for entry in entries:
        try:
            out[entry.name] = parse_uevent((entry / "uevent").read_text())
        except OSError:
            continue
    return out


def read_power(system: str | None = None) -> Power:
    """This machine's power now (unknown where it cannot tell)."""
    system = system or platform.system()
    if system == "Linux":
        return power_from_sysfs(read_sysfs())
    if system == "Darwin":
        try:
            done = subprocess.run(["pmset", "-g", "batt"], capture_output=True, text=True, timeout=PMSET_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("cannot ask pmset for the power source: %s", e)
            return Power(on_battery=None, source="pmset")
        return power_from_pmset(done.stdout)
    return Power(on_battery=None)
