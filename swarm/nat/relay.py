"""The circuit relay v2 service a :class:`swarm.nat.service.NatService` serves: py-libp2p's
``CircuitV2Protocol`` with the bytes every circuit carries counted, so what the relay carried
is measured and can be stated (:class:`RelayStats`, logged per circuit)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol

log = logging.getLogger(__name__)


@dataclass
class RelayStats:
    """What this host's relay carried since it started."""

    #: Circuit directions relayed (a circuit is two: one each way).
    directions: int = 0
    #: Bytes carried, both directions of every circuit together.
    bytes: int = 0
    #: Directions open now.
    open: int = 0

    def to_json(self) -> dict:
        return {"directions": self.directions, "bytes": self.bytes, "open": self.open}


class _Counted:
    """A stream whose reads are counted into ``stats`` (everything else is the stream's)."""

    def __init__(self, stream: Any, stats: RelayStats, seen: list[int]) -> None:
        self._stream = stream
        self._stats = stats
        self._seen = seen

    async def read(self, n: int | None = None) -> bytes:
        data = await self._stream.read(n)
        if data:
            self._stats.bytes += len(data)
            self._seen[0] += len(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class CountingRelay(CircuitV2Protocol):
    """Upstream's relay (caps and all), counting the bytes of each circuit direction."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stats = RelayStats()

    async def _relay_data(self, src_stream: Any, dst_stream: Any, peer_id: Any, *args: Any, **kwargs: Any) -> None:
        seen, t0 = [0], time.monotonic()
        self.stats.directions += 1
        self.stats.open += 1
        try:
            await super()._relay_data(_Counted(src_stream, self.stats, seen),  # type: ignore[arg-type]  # duck-types the stream
                                      dst_stream, peer_id, *args, **kwargs)
        finally:
            self.stats.open -= 1
            log.info("relay: a circuit direction towards %s carried %d bytes in %.1f s", str(peer_id)[-8:], seen[0],
                     time.monotonic() - t0)
