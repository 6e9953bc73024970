"""What a node's hello declares about its numerics, read for verification: its validator class
(``learner.validators.device_class``) and its draw-check class (``learner.draw_check.draw_class``).
Pure functions of the service's peers (peer id -> ``NodeInfo``)."""

from __future__ import annotations

from typing import Mapping, Protocol

from learner.draw_check import draw_class
from learner.validators import device_class
from swarm.proto.hello import Hello


class HasHello(Protocol):
    hello: Hello


def validator_classes(nodes: Mapping[str, HasHello]) -> dict[str, str | None]:
    """Peer id -> the validator class its hello declares (None: not one validators serve). Stage
    nodes serve pipelines, not validation jobs."""
    return {p: None if n.hello.extra.get("stage") == "1" else device_class(n.hello.backend, n.hello.device, n.hello.extra)
            for p, n in nodes.items()}


def draw_class_of(nodes: Mapping[str, HasHello], peer_id: str) -> str:
    """``peer_id``'s class for the draw check (``default`` for a peer that said no hello)."""
    n = nodes.get(peer_id)
    return "default" if n is None else draw_class(n.hello.backend, n.hello.extra, n.hello.extra.get("stage") == "1")
