"""Keep py-libp2p's per-failure log lines off a user's console.

py-libp2p logs every failed dial and every DHT query to a peer that went away as a warning or
error (a DHT keeps peers that left in its tables, so these are routine), through Python's
last-resort handler. ``import libp2p`` resets the level of the ``libp2p`` logger, so the
level is set on its sub-loggers instead, which survives a later import. ``-v`` keeps them.
"""

from __future__ import annotations

import logging

#: py-libp2p sub-loggers that report routine failures of peers that went away.
NOISY_LOGGERS = ("libp2p.kad_dht", "libp2p.transport", "libp2p.network", "libp2p.host", "libp2p.identity",
                 "libp2p.peer", "libp2p.stream_muxer", "libp2p.protocol_muxer", "libp2p.security")


def quiet_libp2p(level: int = logging.CRITICAL) -> None:
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(level)
