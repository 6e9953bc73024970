"""A ``swarm-node join`` command line turned into its :class:`NodeConfig`, checked before anything
starts: by ``join`` itself, by ``service install`` (which writes the same flags) and by
``swarm-node config``. Each field's own bounds and shape are the config's (checked when it is
built); what only a join needs (a learner or a bootstrap peer to reach) is checked here."""

from __future__ import annotations

import argparse

from node_agents.config import NodeConfig
from swarm.config import ConfigError
from swarm.config_flags import Shortcut, flag_error, shortcut_values

__all__ = ["check_join_args", "node_config"]


def node_config(args: argparse.Namespace, shortcuts: tuple[Shortcut, ...]) -> NodeConfig:
    """The :class:`NodeConfig` of the given flags; :class:`ConfigError` worded by flag
    (``--bootstrap (bootstrap): ... must end in /p2p/<peer id>``) for a bad value."""
    try:
        return NodeConfig(**shortcut_values(args, shortcuts))
    except ConfigError as e:
        raise ConfigError(flag_error(e, shortcuts), e.field, e.reason) from None


def check_join_args(cfg: NodeConfig) -> str | None:
    """What a join lacks (None: nothing): a learner or a swarm member to reach."""
    if not cfg.learner and not cfg.bootstrap:
        return "give --learner MULTIADDR or --bootstrap MULTIADDR (any member of the swarm)"
    return None
