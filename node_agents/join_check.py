"""What is wrong with a ``swarm-node join`` command line (its :class:`NodeConfig`), checked before
anything starts: by ``join`` itself and by ``service install``, which writes the same flags."""

from __future__ import annotations

from node_agents.config import NodeConfig
from node_agents.schedule import parse_hours
from swarm.addrs import check_announce, split_peer_id
from swarm.discovery.identity import split_run
from swarm.proto.hello import name_problem

__all__ = ["check_join_args"]


def check_join_args(cfg: NodeConfig) -> str | None:
    """What is wrong with the join's addresses, run name, node name and knobs (None: nothing)."""
    if not cfg.learner and not cfg.bootstrap:
        return "give --learner MULTIADDR or --bootstrap MULTIADDR (any member of the swarm)"
    if name_problem(cfg.name):
        return f"--{name_problem(cfg.name)}"
    if cfg.max_threads < 0 or cfg.threads < 0:
        return "--threads and --max-threads take a number of threads >= 0 (0: no choice, no cap)"
    try:
        parse_hours(cfg.hours)
    except ValueError as e:
        return f"--{e}"
    for addr in ([cfg.learner] if cfg.learner else []) + cfg.bootstrap:
        if not split_peer_id(addr)[1]:
            return f"{addr!r} must end in /p2p/<peer id>"
    try:
        run_id = split_run(cfg.run)[1] if cfg.run else ""
        addr_id = split_peer_id(cfg.learner)[1] if cfg.learner else ""
        if run_id and addr_id and run_id != addr_id:
            return f"--learner is peer {addr_id} but --run names learner {run_id}; give the learner's own address"
        for addr in cfg.announce:
            check_announce(addr)
    except ValueError as e:
        return str(e)
    return None
