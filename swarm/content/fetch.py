"""Fetching the base model: the chunk layer's multi-peer puller (``swarm.chunks.pull``) with the
learner as the anchor (asked alongside the holders: early in a run they are few) and the holders
the learner names, refreshed as nodes report progress."""

from __future__ import annotations

from typing import Awaitable, Callable

from swarm.chunks.choice import PullSettings
from swarm.chunks.pull import Progress, PullError, Puller, Sources
from swarm.content.manifest import model_content_id
from swarm.content.store import ModelCopy

#: A model fetch's settings (the puller's defaults suit it).
FetchSettings = PullSettings
#: Raised when the model could not be fetched (nothing new arrived for ``give_up_s``).
FetchError = PullError


def model_puller(host, copy: ModelCopy, learner_peer: str, holders: Sources, settings: PullSettings | None = None,
                 progress: Progress | None = None,
                 report: Callable[[Puller], Awaitable[None]] | None = None) -> Puller:
    """The puller of ``copy``'s missing chunks from the learner and ``holders()`` at once."""
    return Puller(host, copy, model_content_id(copy.manifest), holders, anchor=learner_peer, settings=settings,
                  progress=progress, report=report)
