"""Who the learner is in the swarm: its key (kept in a data dir, so its peer id survives
restarts) and its run's name (stable for a given config), plus its DHT presence.

- :func:`default_data_dir`: ``$XDG_DATA_HOME/echo-swarm/learner`` (beside the nodes' ``node``).
- :func:`run_name`: ``run.name`` if set, else ``<task>-<model stem>-<8 hex of the config hash>``;
  the hash covers the resolved config minus what differs between machines or launches of
  the same run (``[network]``, ``[dashboard]``, ``[run]``).
- :func:`announce_run`: serve ``run-info`` and provide the run's learner key in the DHT.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict
from pathlib import Path

from swarm.discovery.keys import check_run_name, run_key, slug

log = logging.getLogger("echo_swarm.learner")

#: Config sections left out of the run-name hash (machine- or launch-specific).
UNHASHED_SECTIONS = ("network", "dashboard", "run")


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "echo-swarm" / "learner"


def config_hash(cfg) -> str:
    """Hex SHA-256 of the config without :data:`UNHASHED_SECTIONS` (canonical JSON)."""
    data = {k: v for k, v in asdict(cfg).items() if k not in UNHASHED_SECTIONS}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def run_name(cfg) -> str:
    """The run's name: ``cfg.run.name`` (validated) or one derived from the config."""
    if cfg.run.name:
        return check_run_name(cfg.run.name)
    model = cfg.model.name.rstrip("/\\")
    stem = Path(model).stem if model.endswith(".gguf") else Path(model).name
    return check_run_name(f"{slug(cfg.task.name, 20)}-{slug(stem, 40)}-{config_hash(cfg)[:8]}")


async def announce_run(host, discovery, name: str) -> None:
    """Answer ``run-info`` as this run's learner and provide its learner key in the DHT."""
    from swarm.discovery.bootstrap import serve_run_info
    from swarm.proto.discovery import RunInfo

    serve_run_info(host, lambda peer: RunInfo(run_name=name, role="learner", learner=host.peer_id,
                                              learner_addrs=host.advertised_addrs(peer)))
    await discovery.provide(run_key(name, "learner"))


async def join_swarm(host, discovery, bootstrap: list[str], console) -> None:
    """Join an existing swarm's DHT through the first live ``bootstrap`` address (a
    restarted learner re-announcing itself); a failure is reported, not fatal."""
    from swarm.discovery.bootstrap import NoBootstrap, connect_first

    if not bootstrap:
        return
    try:
        peer = await connect_first(host, bootstrap, lambda text: console(f"learner: {text}"))
    except NoBootstrap as e:
        console(f"learner: {e}; waiting for nodes to find us")
        return
    await discovery.add_peer(peer)
    console(f"learner: joined the swarm's DHT through {peer[-6:]}")
