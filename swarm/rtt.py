"""Waits that follow the link: a timeout that an honest peer on a slow link could exceed grows
with that peer's measured round trip (:meth:`swarm.host.SwarmHost.rtt`), never below its named
default (a setting whose default holds at 300 ms and 2% loss, see ``docs/deploy.md``).

A wait of ``k`` round trips (a dial is about 5: TCP, multistream, Noise, multistream, yamux) is
``scaled(default_s, rtt_s, k)``: the default, or ``LOSS_MARGIN`` times ``k`` round trips when
that is longer, so that a retransmission or two (a lost segment costs at least one RTO of
about 1-2 round trips) still fits.
"""

from __future__ import annotations

import math

#: Factor on ``k`` round trips for retransmissions on a lossy link.
LOSS_MARGIN = 3.0
#: Longest a scaled wait may grow to, as a multiple of its default (a peer's reported round
#: trip is measured by our own muxer, but a peer can still slow its answers on purpose).
MAX_FACTOR = 10.0


def scaled(default_s: float, rtt_s: float | None, round_trips: float) -> float:
    """``max(default_s, LOSS_MARGIN * round_trips * rtt_s)``, at most ``MAX_FACTOR * default_s``;
    ``default_s`` when the round trip is unknown (None, 0 or not finite)."""
    if rtt_s is None or not math.isfinite(rtt_s) or rtt_s <= 0:
        return default_s
    return min(MAX_FACTOR * default_s, max(default_s, LOSS_MARGIN * round_trips * rtt_s))
