"""Run-info request: "which run do you belong to?", asked of a bootstrap peer by a node
that was given no ``--run``. Every member answers: the learner about itself, a node about
the learner it serves (empty run name while it has not joined one)."""

from __future__ import annotations

from dataclasses import dataclass, field

from swarm.wire import Message


@dataclass
class RunInfoRequest(Message):
    KIND = "run_info_request"


@dataclass
class RunInfo(Message):
    KIND = "run_info"
    #: The run's name (empty: the peer is in no run yet).
    run_name: str
    #: ``learner`` or ``node``: the role of the peer that answers.
    role: str
    #: Peer id of the run's learner (empty if unknown).
    learner: str = ""
    #: The learner's addresses as the answering peer knows them (each ending in ``/p2p/<id>``).
    learner_addrs: list[str] = field(default_factory=list, metadata={"max_items": 64})
