"""Run-info request: "which run do you belong to?", asked of a bootstrap peer by a node
that was given no ``--run``. Every member answers: the learner about itself, a node about
the learner it serves (empty run name while it has not joined one)."""

from __future__ import annotations

from dataclasses import dataclass, field

from swarm.wire import Message, bounded, bounded_default


@dataclass
class RunInfoRequest(Message):
    KIND = "run_info_request"


@dataclass
class RunInfo(Message):
    KIND = "run_info"
    #: The run's name (empty: the peer is in no run yet).
    run_name: str = bounded(max_items=256)
    #: ``learner`` or ``node``: the role of the peer that answers.
    role: str = bounded(max_items=16)
    #: Peer id of the run's learner (empty if unknown).
    learner: str = bounded_default("", max_items=128)
    #: The learner's addresses as the answering peer knows them (each ending in ``/p2p/<id>``).
    learner_addrs: list[str] = field(default_factory=list, metadata={"max_items": 64, "max_len": 512})
