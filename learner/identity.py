"""Who the learner is in the swarm: its key (kept in a data dir, so its peer id survives
restarts) and its run's name (stable for a given config), plus its DHT presence.

- :func:`default_data_dir`: ``$XDG_DATA_HOME/echo-swarm/learner`` (beside the nodes' ``node``).
- :func:`run_name`: ``run.name`` if set, else ``<task>-<model stem>-<8 hex of the config hash>``;
  the hash covers the resolved config minus what differs between machines or launches of
  the same run (``[network]``, ``[dashboard]``, ``[run]``).
- :func:`announce_run`: serve ``run-info`` and provide the run's learner key in the DHT.
- :func:`join_line`: the printed join command, naming the run by ``<name>@<learner peer id>``:
  nodes started from it accept no other peer as their learner.
- :func:`keep_peers` / :func:`join_swarm`: the nodes' addresses are kept beside the key, so a
  restarted learner (even on another port) rejoins the DHT through them and re-announces itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict
from pathlib import Path

from learner.roster import NodeRoster
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


def join_line(name: str, peer_id: str, bootstrap: str) -> str:
    """The console line that tells operators how nodes join: the run's identity
    (``NAME@PEERID``, so nodes accept no other learner) and one address to bootstrap from."""
    from swarm.discovery.identity import RunIdentity, join_command

    return (f"learner: run {name}; join with `{join_command(RunIdentity(name, peer_id), bootstrap)}` "
            "(any member's address works as --bootstrap)")


async def join_swarm(host, discovery, bootstrap: list[str], console, key_dir=None) -> None:
    """Join an existing swarm's DHT through the first live address of ``bootstrap``, then of
    the nodes remembered in ``key_dir`` (a restarted learner, maybe on another port, is
    found again through them); a failure is reported, not fatal."""
    from swarm.discovery.bootstrap import NoBootstrap, connect_first

    remembered = [a for a in remembered_peers(key_dir) if a not in bootstrap] if key_dir else []
    if not bootstrap and not remembered:
        return
    try:
        peer = await connect_first(host, bootstrap, lambda text: console(f"learner: {text}")) if bootstrap else ""
    except NoBootstrap as e:
        console(f"learner: {e}")
        peer = ""
    if not peer and remembered:
        try:
            peer = await connect_first(host, remembered, log.info)
        except NoBootstrap:
            log.info("none of the %d remembered nodes answered", len(remembered))
    if not peer:
        console("learner: waiting for nodes to find us")
        return
    await discovery.add_peer(peer)
    console(f"learner: joined the swarm's DHT through {peer[-6:]}")


#: File in the learner's key dir: addresses of nodes seen in hellos (to rejoin the DHT after a restart).
PEERS_FILE = "peers.json"
#: Most nodes remembered, and most addresses kept per node.
MAX_REMEMBERED_PEERS = 32
MAX_ADDRS_PER_PEER = 4
#: How often (s) the remembered nodes are written.
REMEMBER_EVERY_S = 30.0


def remembered_peers(key_dir) -> list[str]:
    """Node addresses saved by :func:`keep_peers` (empty if none or unreadable)."""
    path = Path(key_dir) / PEERS_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        log.warning("ignoring %s: %s", path, e)
        return []
    if not isinstance(data, list):
        return []
    return [a for a in data if isinstance(a, str) and "/p2p/" in a]


def peers_to_remember(addrs_by_peer: dict[str, list[str]]) -> list[str]:
    """At most ``MAX_REMEMBERED_PEERS`` nodes, ``MAX_ADDRS_PER_PEER`` addresses each (pure)."""
    out: list[str] = []
    for _peer, addrs in list(addrs_by_peer.items())[-MAX_REMEMBERED_PEERS:]:
        out += [a for a in addrs if "/p2p/" in a][:MAX_ADDRS_PER_PEER]
    return out


async def keep_peers(key_dir: Path, roster: NodeRoster, every_s: float = REMEMBER_EVERY_S) -> None:
    """Save the addresses of the nodes that said hello (``roster``) to ``key_dir/peers.json`` whenever
    they changed, checked every ``every_s`` seconds (run it in a nursery)."""
    import trio

    path = Path(key_dir) / PEERS_FILE
    last: list[str] = []
    while True:
        await trio.sleep(every_s)
        addrs = peers_to_remember(roster.addrs())
        if addrs and addrs != last:
            tmp = path.with_name(f".{PEERS_FILE}.tmp")
            try:
                tmp.write_text(json.dumps(addrs, indent=0))
                tmp.replace(path)
                last = addrs
            except OSError as e:
                log.warning("cannot write %s: %s", path, e)
