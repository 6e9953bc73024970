"""Starting and watching real processes in the integration tests."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def wait_for(cond, timeout: float, what: str, procs=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{what}: process {p.args[:4]} exited with {p.returncode}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")
