"""A running node and the commands beside it meet in its data dir.

- ``node.lock``: held (``flock``) by the running ``swarm-node join`` for its whole life, so a
  second node on the same data dir (the same identity) is refused, and ``swarm-node
  pause|resume|status`` can tell whether a node runs there. The file holds the holder's pid.
- ``pause``: the owner's pause (``swarm-node pause``), a small JSON object; its presence pauses
  the node (after the lease in hand) until ``swarm-node resume`` removes it. It outlives a
  restart: a paused node starts paused.

Only ``swarm-node pause`` / ``resume`` write the pause file; only the node writes the lock.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

try:  # POSIX; elsewhere no lock is kept (and running() cannot tell)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = "node.lock"
PAUSE_FILE = "pause"
#: Longest owner's reason kept (characters).
MAX_REASON = 200


class AlreadyRunning(Exception):
    """Another node runs with this data dir."""


class NodeLock:
    """The running node's hold on its data dir (a context manager)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / LOCK_FILE
        self._fd: int | None = None

    def __enter__(self) -> "NodeLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                pid = _read_pid(self.path)
                raise AlreadyRunning(f"another swarm-node{f' (pid {pid})' if pid else ''} runs with data dir "
                                     f"{self.path.parent}; stop it or give this one another --data-dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip() or 0) or None
    except (OSError, ValueError):
        return None


def running(data_dir: Path) -> int | None:
    """The pid of the node running with ``data_dir`` (None: none runs, or no lock can be read)."""
    path = Path(data_dir) / LOCK_FILE
    if fcntl is None or not path.exists():
        return None
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return _read_pid(path) or -1
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def pause(data_dir: Path, reason: str = "") -> None:
    """Write the owner's pause (atomically)."""
    path = Path(data_dir) / PAUSE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"reason": reason[:MAX_REASON], "at": time.time()}))
    os.replace(tmp, path)


def resume(data_dir: Path) -> bool:
    """Remove the owner's pause; whether there was one."""
    try:
        (Path(data_dir) / PAUSE_FILE).unlink()
        return True
    except FileNotFoundError:
        return False


def owner_pause(data_dir: Path) -> str | None:
    """The owner's reason when the node is paused by its owner ("" without one), else None. A
    pause file that cannot be parsed still pauses (its reason is then empty)."""
    path = Path(data_dir) / PAUSE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    try:
        reason = json.loads(text).get("reason", "")
    except (ValueError, AttributeError):
        return ""
    return "".join(c for c in str(reason) if c.isprintable())[:MAX_REASON]
