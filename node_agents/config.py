"""Typed configuration of a node (``swarm-node join``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "echo-swarm" / "node"


@dataclass
class NodeConfig:
    #: Full multiaddr of the learner, including ``/p2p/<peer id>``.
    learner: str
    #: Generation backend (``llamacpp``).
    backend: str = "llamacpp"
    #: Base model: ``default`` or a path to a GGUF file.
    model: str = "default"
    #: Identity key and scratch files live here (same peer id across restarts).
    data_dir: Path = default_data_dir()
    #: Multiaddr the node listens on.
    listen: str = "/ip4/127.0.0.1/tcp/0"
    #: CPU threads for generation (0 = all cores).
    threads: int = 0
    #: Most prompt groups asked for in one lease.
    max_groups: int = 1
    #: Seconds allowed for one request to the learner (long polls get this on top).
    request_timeout_s: float = 60.0
    #: First reconnect delay after losing the learner; doubles up to ``backoff_max_s``.
    backoff_initial_s: float = 0.5
    #: Longest reconnect delay.
    backoff_max_s: float = 15.0
    #: Give up after this many consecutive failed connection attempts (0 = never).
    max_retries: int = 0
    #: Context window of the backend, tokens (prompt + completion).
    n_ctx: int = 2048
    #: Measure generation speed at join and report it in the hello.
    probe: bool = True
