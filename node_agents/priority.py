"""The node's CPU and disk priority: low by default, so the machine's owner comes first.

``low``: nice 19 everywhere; on Linux also the ``SCHED_IDLE`` CPU policy (the kernel runs the node
only on a core nothing else wants) and the idle I/O class (``ioprio_set``), each where the system
allows it. ``normal``: unchanged. Linux keeps these per thread and a new thread inherits its
creator's: :func:`apply_priority` must run before the node starts threads (llama.cpp's, torch's,
trio's workers), first thing in ``swarm-node join``.

:func:`priority_plan` is the pure decision; :func:`apply_priority` carries it out and says what
it could do.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

log = logging.getLogger("echo_swarm.node")

#: The niceness of a low-priority node (the lowest priority).
LOW_NICE = 19
#: ``ioprio_set`` syscall numbers by machine (other machines keep their I/O class).
IOPRIO_SET = {"x86_64": 251, "aarch64": 30, "arm64": 30}
IOPRIO_WHO_PROCESS, IOPRIO_CLASS_IDLE, IOPRIO_CLASS_SHIFT = 1, 3, 13


def priority_plan(priority: str, system: str) -> list[str]:
    """The steps of ``priority`` (``low`` or ``normal``) on ``system`` (``platform.system()``)."""
    if priority == "normal":
        return []
    if priority != "low":
        raise ValueError(f"priority {priority!r}: expected low or normal")
    return ["nice", "sched_idle", "ioprio_idle"] if system == "Linux" else ["nice"]


def apply_priority(priority: str, system: str | None = None, machine: str | None = None) -> list[str]:
    """Lower this process's priority as :func:`priority_plan` says; returns what was done, in
    words (``nice 19``, ``SCHED_IDLE``, ``idle I/O``), or why a step could not be."""
    done = []
    for step in priority_plan(priority, system or platform.system()):
        try:
            if step == "nice":
                now = os.getpriority(os.PRIO_PROCESS, 0)
                if now < LOW_NICE:
                    os.nice(LOW_NICE - now)
                done.append(f"nice {os.getpriority(os.PRIO_PROCESS, 0)}")
            elif step == "sched_idle":
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
                done.append("SCHED_IDLE")
            elif step == "ioprio_idle":
                done.append(_ioprio_idle(machine or platform.machine()))
        except (OSError, AttributeError) as e:
            done.append(f"no {step} ({e})")
    return done


def _ioprio_idle(machine: str) -> str:
    number = IOPRIO_SET.get(machine)
    if number is None:
        return f"no idle I/O (no ioprio_set number known for {machine})"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, IOPRIO_WHO_PROCESS, 0, IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT) != 0:
        return f"no idle I/O ({os.strerror(ctypes.get_errno())})"
    return "idle I/O"


def cap_threads(threads: int, max_threads: int, cores: int) -> int:
    """The generation threads under ``--max-threads``: ``threads`` as chosen (0 = the backend's
    default, every core), capped at ``max_threads`` (0 = no cap); never below 1 once capped."""
    if max_threads <= 0:
        return threads
    return max(1, min(threads or cores, max_threads))
