"""The node's priority (``node_agents/priority.py``): the plan is pure; applying it is checked in a
child process (it lowers the caller for good), including that threads started later inherit it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from node_agents.priority import cap_threads, priority_plan

CHILD = r"""
import ctypes, json, os, platform, sys, threading
from node_agents.priority import apply_priority
done = apply_priority(sys.argv[1])
out = {"done": done}
def look(into):
    into["nice"] = os.getpriority(os.PRIO_PROCESS, 0)
    into["policy"] = os.sched_getscheduler(0)
    # ioprio_get(IOPRIO_WHO_PROCESS, 0): class in the top bits
    into["ioclass"] = ctypes.CDLL(None, use_errno=True).syscall({"x86_64": 252, "aarch64": 31}[platform.machine()], 1, 0) >> 13
look(out)
later = {}
t = threading.Thread(target=look, args=(later,)); t.start(); t.join()
out["thread"] = later
print(json.dumps(out))
"""


def run_child(priority: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", CHILD, priority], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_plan():
    assert priority_plan("low", "Linux") == ["nice", "sched_idle", "ioprio_idle"]
    assert priority_plan("low", "Darwin") == ["nice"]
    assert priority_plan("normal", "Linux") == []
    with pytest.raises(ValueError, match="expected low or normal"):
        priority_plan("high", "Linux")


def test_low_priority_on_linux_is_nice_19_sched_idle_and_idle_io_also_for_later_threads():
    out = run_child("low")
    assert out["done"] == ["nice 19", "SCHED_IDLE", "idle I/O"], out
    for view in (out, out["thread"]):
        assert (view["nice"], view["policy"], view["ioclass"]) == (19, os.SCHED_IDLE, 3), out


def test_normal_priority_changes_nothing():
    out = run_child("normal")
    assert out["done"] == [] and out["policy"] == os.SCHED_OTHER and out["nice"] == os.getpriority(os.PRIO_PROCESS, 0)


@pytest.mark.parametrize("threads, cap, cores, expected", [
    (0, 0, 8, 0), (6, 0, 8, 6), (0, 2, 8, 2), (6, 2, 8, 2), (1, 4, 8, 1), (0, 16, 8, 8), (3, 4, 2, 3),
])
def test_thread_cap(threads, cap, cores, expected):
    assert cap_threads(threads, cap, cores) == expected
