"""Who may join: the learner's answer to a node's hello (``HELLO``), beside the work desk.

In order, a hello is refused when the node asked for another run (``--run``), when admission
refuses it (``learner/admission.py``: allowlist, join token, untrusted), when its base model is not
the run's (``learner/model_serve.py``), or when it is a stage node whose geometry is bad or differs
from the run's (``learner/pipelines.py``). An accepted node enters the roster
(:class:`~learner.roster.NodeRoster`) and the pipeline planner; a node that joins again has lost
whatever it was generating, so its leases go back to pending at once.

Every hello also sweeps the roster for idle nodes (amortised O(1), see :mod:`learner.roster`) and
tells the planner and the dissemination service to forget the nodes the roster forgot, so nothing
a stream of strangers leaves behind outlives them. A hello costs O(1) in the number of nodes ever
seen: no list of them is walked, and only a stage node's hello re-plans the pipelines.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import trio

from learner.adapter_versions import AdapterVersions
from learner.admission import Admission
from swarm.changes import Changes
from learner.coordinator import Coordinator
from learner.dissem import LearnerDissem
from learner.draw_check import draw_class
from learner.model_serve import HELLO_MODEL_NAME_KEY, LearnerModelServe, hello_model_check
from learner.pipelines import Candidate, PipelineManager
from learner.replay import numerics_of
from learner.roster import NodeRoster
from learner.validators import device_class
from swarm.discovery.keys import run_mismatch
from swarm.proto.hello import Hello, HelloAck

log = logging.getLogger("echo_swarm.learner")


@dataclass(frozen=True)
class JoinTerms:
    """What every hello ack tells a node of the run, and what its hello must match."""

    #: This run's id (a resume keeps it).
    run_id: str
    #: The base model's name.
    model_name: str
    #: The run's name: a node that asked for another run (``--run``) is refused ("": no check).
    run_name: str = ""
    #: The base model's content hash: a node whose hello names another is refused ("": no check).
    model_sha256: str = ""


class HelloDesk:
    def __init__(self, roster: NodeRoster, coordinator: Coordinator, pipelines: PipelineManager,
                 versions: AdapterVersions, changes: Changes, terms: JoinTerms, *,
                 admission: Admission | None = None, model_serve: LearnerModelServe | None = None,
                 dissem: LearnerDissem | None = None) -> None:
        self.roster = roster
        self.coordinator = coordinator
        self.pipelines = pipelines
        self.versions = versions
        self.changes = changes
        self.terms = terms
        self.admission = admission
        self.model_serve = model_serve
        self.dissem = dissem

    def refusal(self, reason: str, retry_after_s: float = 0.0, model_sha256: str = "") -> HelloAck:
        t = self.terms
        return HelloAck(accepted=False, run_id=t.run_id, model=t.model_name, current_version=0, reason=reason,
                        retry_after_s=retry_after_s, model_sha256=model_sha256, run_name=t.run_name)

    async def on_hello(self, msg: Hello, peer_id: str) -> HelloAck:
        """The ``HELLO`` handler: every ack carries the run's name."""
        why = run_mismatch(msg.run_name, self.terms.run_name)
        if why:
            log.warning("refused node %s: %s", peer_id[-6:], why)
            return self.refusal(why)
        ack = self.admit(msg, peer_id)
        ack.run_name = self.terms.run_name
        return ack

    def admit(self, msg: Hello, peer_id: str) -> HelloAck:
        """Admission, the model check and the planner's; then the node enters the roster."""
        if self.admission is not None:  # learner/admission.py: allowlist, join token, untrusted
            decision = self.admission.on_hello(peer_id, msg.join_token, time.time())
            if not decision.accepted:
                log.warning("refused node %s: %s", peer_id[-6:], decision.reason)
                return self.refusal(decision.reason, decision.retry_after_s)
        reason = hello_model_check(msg.model_sha256, msg.extra.get(HELLO_MODEL_NAME_KEY, ""),
                                   self.terms.model_sha256, self.terms.model_name,
                                   self.model_serve.form_shas() if self.model_serve is not None else ())
        if reason:
            log.warning("refused node %s: %s", peer_id[-6:], reason)
            return self.refusal(reason, model_sha256=self.terms.model_sha256)
        now = trio.current_time()
        try:
            candidate = Candidate.from_hello(msg)
            self.pipelines.enter(peer_id, candidate, now)
        except ValueError as e:
            log.warning("refused node %s: %s", peer_id[-6:], e)
            return self.refusal(str(e))
        self.sweep(now)
        klass = None if candidate.model is not None else device_class(msg.backend, msg.device, msg.extra)
        draw = draw_class(msg.backend, msg.extra, msg.extra.get("stage") == "1")
        known = self.roster.admit(peer_id, msg, now, klass=klass, stage_model=candidate.model, draw_klass=draw,
                                  numerics=numerics_of(msg.backend, msg.extra))
        if known:  # a node that re-joins has lost whatever it was generating
            self.coordinator.release_peer(peer_id)
            self.changes.notify()
        view = self.roster.get(peer_id)
        log.info("node %s%s %s: backend=%s device=%s mem=%.1f GiB %.0f tok/s", peer_id[-6:],
                 f" ({view.name})" if view is not None and view.name else "", "re-joined" if known else "joined",
                 msg.backend[:64], msg.device[:64], msg.memory_bytes / 2**30, msg.tokens_per_s)
        t = self.terms
        return HelloAck(accepted=True, run_id=t.run_id, model=t.model_name, current_version=self.versions.newest(),
                        model_sha256=t.model_sha256,  # a private run's membership ticket (swarm/membership.py):
                        ticket=self.model_serve.ticket_for(peer_id) if self.model_serve is not None else None)

    def rejoin_stage(self, peer_id: str, now: float) -> None:
        """A stage node dropped from the plan (lost or silent) asks for work again: back in."""
        view, model = self.roster.get(peer_id), self.roster.stage_model(peer_id)
        if view is not None and model is not None:
            self.pipelines.enter(peer_id, Candidate(view.memory_bytes, view.announced_tokens_per_s, view.addrs, model),
                                 now)

    def sweep(self, now: float) -> list[str]:
        """Forget idle nodes (:meth:`NodeRoster.forget_idle`) everywhere they are remembered;
        a node holding a lease or serving a pipeline stage is kept. Returns the peers forgotten."""
        ledger, pipelines = self.coordinator.ledger, self.pipelines
        gone = self.roster.forget_idle(now, keep=lambda p: ledger.is_busy(p) or pipelines.is_stage(p))
        for peer in gone:
            pipelines.leave(peer, now, "idle")
            if self.dissem is not None:
                self.dissem.forget(peer)
        if gone:
            log.info("forgot %d idle node(s) that never contributed", len(gone))
        return gone
