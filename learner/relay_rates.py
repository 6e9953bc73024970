"""Upload rates the learner measures itself, for placing nodes in the broadcast tree.

A node's own ``upload_bps`` claim is never used for placement (a stranger claiming a huge
upload would otherwise sit at the root of the tree and withhold or drip chunks). Instead, when
a node reports that it holds a version (``dissem-have``), each relay it names as a sender is
credited with the bytes it sent over the time from the version's start to the report's
arrival at the learner (both the learner's own clock). A relay's rate is the median of its
last ``SAMPLES`` credits, rounded down to a power of two (so plans do not change on noise), and
ranks it in the next plans; a node never measured ranks as the median measured relay (so new
nodes get tried as relays and measured), or last when nothing is measured yet.

A reporter can only credit its parents with what it says they sent; the median over several
reporters and versions limits what one lying child can do, and a relay that does not deliver
is never credited at all.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Container, Mapping

#: Credits kept per relay.
SAMPLES = 8


class RelayRates:
    def __init__(self, chunk_bytes: int) -> None:
        self.chunk_bytes = chunk_bytes
        self.samples: dict[str, deque[float]] = {}

    def observe(self, reporter: str, sources: Mapping[str, int], elapsed_s: float, members: Container[str]) -> None:
        """A report of ``reporter``: ``sources`` (peer -> chunks it sent) over ``elapsed_s``; only
        members other than the reporter are credited."""
        if not (elapsed_s > 0 and math.isfinite(elapsed_s)):
            return
        for peer, chunks in sources.items():
            if peer == reporter or peer not in members or not isinstance(chunks, int) or chunks <= 0:
                continue
            self.samples.setdefault(peer, deque(maxlen=SAMPLES)).append(chunks * self.chunk_bytes / elapsed_s)

    def forget(self, peer: str) -> None:
        self.samples.pop(peer, None)

    def measured(self, peer: str) -> float | None:
        """The relay's measured upload (bytes/s, a power of two), or None if never measured."""
        got = self.samples.get(peer)
        if not got:
            return None
        return float(2 ** math.floor(math.log2(max(statistics.median(got), 1.0))))

    def placement_bps(self, peer: str) -> float:
        """What ranks ``peer`` in a plan: its measured rate, else the median measured relay's
        (0 when none is measured)."""
        mine = self.measured(peer)
        if mine is not None:
            return mine
        known = [r for r in (self.measured(p) for p in self.samples) if r is not None]
        return statistics.median(known) if known else 0.0
