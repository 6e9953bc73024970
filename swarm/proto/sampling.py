"""The sampling settings of a generation: what every lease carries (``swarm.proto.work.Lease``)
and what a validation job replays with (``swarm.proto.validate.ValidateJob``)."""

from __future__ import annotations

from dataclasses import dataclass

from swarm.wire import Message, bounded


@dataclass
class Sampling(Message):
    KIND = "sampling"
    temperature: float = bounded(min=0.0, max=10.0)
    top_p: float = bounded(min=0.0, max=1.0)
    max_tokens: int = bounded(min=1, max=32768)
    #: Base seed; completion j of a group uses a seed derived from (seed, j).
    seed: int = bounded(min=0, max=2**63 - 1)
