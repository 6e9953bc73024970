"""The learner's network face: a thin table of protocol handlers over the parts that own the state.

Every collaborator is a constructor argument; the parts it owns are built from them in the
constructor, each the one writer of its state:

- hello (``HELLO``): :class:`~learner.hello_desk.HelloDesk` (run name, admission, model identity,
  stage geometry; the node enters the :class:`~learner.roster.NodeRoster`);
- work (``WORK``): :class:`~learner.work_desk.WorkDesk` decides a node's next work;
- rollouts (``ROLLOUTS``): :class:`~learner.push_desk.PushDesk` (the coordinator accepts or rejects
  each group; picked pushes are held for verification, :class:`~learner.verify_queue.VerifyQueue`);
- adapters (``ADAPTER``, ``STAGE_ADAPTER``): :class:`~learner.adapter_versions.AdapterVersions`;
- stage reports (``STAGE_REPORT``): :func:`learner.stage_requests.stage_report`;
- validation results (``VALIDATE``): :class:`~learner.validator_desk.ValidatorDesk`.

Group states are the coordinator's :class:`~learner.group_ledger.GroupLedger`'s; what the service
remembers of nodes is the roster's. Readers (the dashboard, ``swarm.json``) take typed snapshots:
:meth:`LearnerService.statistics`. Nodes must say hello before anything else; a stranger's work
request or push is refused with a logged reason and changes nothing. Adding a protocol is one
entry in :meth:`LearnerService.handlers`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from learner.adapter_versions import AdapterVersions
from learner.admission import Admission
from swarm.changes import Changes
from swarm.log_limit import LogLimit
from learner.coordinator import Coordinator, CoordinatorStats
from learner.dissem import LearnerDissem
from learner.dissem_report import DissemStats
from learner.episodes import EpisodeSettings
from learner.config import PipelineConfig, SyncConfig
from learner.hello_desk import HelloDesk, JoinTerms
from learner.lease_gate import LeaseGate
from learner.ledger import WorkLedger
from learner.model_serve import LearnerModelServe
from learner.pipelines import PipelineManager
from learner.push_desk import PushDesk
from learner.replay_llamacpp import LlamaCppReplay
from learner.roster import IDLE_FORGET_S, NodeRoster, RosterStats  # noqa: F401 (IDLE_FORGET_S re-exported)
from learner.stage_requests import describe_pipelines, stage_adapter, stage_report
from learner.validator_desk import ValidatorConfig, ValidatorDesk
from learner.verify import Verifier
from learner.verify_queue import VerifyQueue
from learner.work_desk import SamplingDefaults, WorkDesk
from swarm.proto import ADAPTER, HELLO, ROLLOUTS, WORK
from swarm.proto.adapter import AdapterReply, AdapterRequest
from swarm.proto.hello import Hello, HelloAck
from swarm.proto.rollouts import RolloutAck, RolloutPush
from swarm.proto.stage import STAGE_ADAPTER, STAGE_REPORT, StageAdapterRequest, StageReport, StageReportAck
from swarm.proto.validate import VALIDATE, ValidateAck, ValidateResult
from swarm.proto.work import WorkReply, WorkRequest
from swarm.wire import Message

if TYPE_CHECKING:
    from swarm.host import SwarmHost

__all__ = ["LearnerService", "Refused", "SamplingDefaults", "ServiceSettings", "ServiceStats", "short"]

log = logging.getLogger("echo_swarm.learner")

#: Seconds a rollout push may take to be handled. The handler only validates and records the
#: push (verification runs after the ack, ``learner/verify_queue.py``), but a push is the
#: largest request a node sends, so it gets twice the host's default handler deadline; a node
#: waits ``NodeConfig.push_timeout_s`` (longer) for the ack.
PUSH_HANDLER_TIMEOUT_S = 60.0


class Refused(ValueError):
    """A request the learner will not serve (the peer receives the message)."""


@dataclass
class ServiceSettings:
    """What the service tells nodes and how long it waits for them."""

    #: Sampling settings every lease carries.
    sampling: SamplingDefaults
    #: Completions per prompt group (GRPO's G).
    group_size: int
    #: This run's id (changes on every fresh start; a resume keeps it): in every hello ack.
    run_id: str
    #: The base model's name, in every hello ack.
    model_name: str
    #: The longest a work request waits for work before "no work, ask again" (s).
    long_poll_s: float
    #: The run's name (``learner.identity.run_name``): in every hello ack; a node that asked
    #: for another run (``--run``) is refused. Empty = no check.
    run_name: str = ""
    #: Content hash of the run's base model (``swarm.content.model_id``); a node whose hello
    #: names another is refused. Empty = no check.
    model_sha256: str = ""
    #: The fair-start gate (``learner/lease_gate.py``).
    gate: SyncConfig = field(default_factory=SyncConfig)
    #: How the pipelines of stage nodes are planned (the ``[pipeline]`` config section).
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)


@dataclass(frozen=True)
class ServiceStats:
    """What the dashboard and the report read of the learner's service (:meth:`LearnerService.statistics`)."""

    run_id: str
    #: The run is over (every long poll answers ``done``).
    done: bool
    roster: RosterStats
    coordinator: CoordinatorStats
    #: None: adapters by direct fetch only.
    dissem: DissemStats | None
    #: Peer -> its place in the pipelines (:meth:`learner.pipelines.PipelineManager.roles`).
    stages: dict[str, str]
    #: Work per node (``learner/ledger.py``): pushed, verified by which test, trained.
    work: dict[str, dict[str, Any]]


#: One protocol handler: (protocol id, request type, the handler, its deadline in s or None).
Handler = tuple[str, type[Message], Callable[[Any, str], Awaitable[Message]], float | None]


class LearnerService:
    """The handlers of every learner protocol over the coordinator and its parts.

    Optional collaborators (None = the feature is off): ``admission`` (None: anyone may join,
    no caps), ``verifier`` (None: pushes are not re-scored; else :meth:`verify_loop` must run),
    ``episode`` (multi-turn runs: the settings every lease carries), ``dissem`` (None: adapters
    by direct fetch only), ``model_serve`` (the base model's server: membership tickets),
    ``console`` (where each new plan of stage pipelines is printed), ``probe`` (the learner's own
    check of a stage a pipeline head reports lost), ``replay`` (exact re-generation of picked
    groups, ``learner/replay.py``), ``validators`` (validator nodes, ``learner/validator_desk.py``).
    """

    def __init__(self, coordinator: Coordinator, settings: ServiceSettings, *,
                 versions: AdapterVersions | None = None, roster: NodeRoster | None = None,
                 admission: Admission | None = None, verifier: Verifier | None = None,
                 episode: EpisodeSettings | None = None, dissem: LearnerDissem | None = None,
                 model_serve: LearnerModelServe | None = None,
                 console: Callable[[str], None] | None = None,
                 probe: Callable[[str], Awaitable[bool]] | None = None,
                 ledger: WorkLedger | None = None, replay: LlamaCppReplay | None = None,
                 validators: ValidatorConfig | None = None) -> None:
        s = self.settings = settings
        self.coordinator = coordinator
        self.versions = versions if versions is not None else AdapterVersions()
        #: Nodes that said hello (the dissemination's and the model server's admit check reads it).
        self.roster = roster if roster is not None else NodeRoster()
        self.admission = admission
        self.verifier = verifier
        self.dissem = dissem
        self.model_serve = model_serve
        #: Where a new plan of stage pipelines is shown to the operator (None: logged only).
        self.console = console
        #: The learner's own probe of a stage a head reported lost (``learner.stage_requests.stage_alive``);
        #: None: the head's report alone is taken as evidence (harnesses without a host).
        self.probe = probe
        #: Refusals of peers that did not say hello, logged once a minute per peer.
        self._refusals_logged = LogLimit()
        #: Work per node over the run (``learner/ledger.py``): pushed, verified by which test, trained.
        self.ledger = ledger if ledger is not None else WorkLedger()
        self.changes = Changes()
        self.pipelines = PipelineManager(s.group_size, s.sampling.max_tokens, s.pipeline, on_plan=self._plan_changed,
                                         links=dissem.link_snapshot if dissem is not None else None,
                                         rtt=dissem.host.rtt if dissem is not None else None)
        self.hello = HelloDesk(self.roster, coordinator, self.pipelines, self.versions, self.changes,
                               JoinTerms(s.run_id, s.model_name, s.run_name, s.model_sha256),
                               admission=admission, model_serve=model_serve, dissem=dissem)
        self.desk = WorkDesk(coordinator, self.pipelines, LeaseGate(s.gate), self.changes, sampling=s.sampling,
                             group_size=s.group_size, long_poll_s=s.long_poll_s, admission=admission, episode=episode,
                             speed_of=self.roster.announced_speed)
        #: Validator nodes for numerics the learner cannot replay (``learner/validator_desk.py``).
        self.validators = None if verifier is None or validators is None or not validators.enabled else ValidatorDesk(
            validators, s.sampling, classes=self.roster.classes, untrust=self.untrust, wake=self.changes.notify)
        self.checks = None if verifier is None else VerifyQueue(
            verifier, coordinator, self.changes, backend_of=self.roster.backend_of, class_of=self.roster.draw_class_of,
            untrust=self.untrust, credit=self.roster.credit, replay=replay, on_checked=self.ledger.checked,
            validators=self.validators, newcomer_s_per_step=verifier.cfg.newcomer_s_per_step)
        self.pushes = PushDesk(coordinator, self.roster, self.ledger, self.changes, admission=admission,
                               checks=self.checks)
        self._described = ""

    # -- wiring ----------------------------------------------------------------------------
    def handlers(self) -> list[Handler]:
        """Every protocol the learner serves to nodes."""
        return [(HELLO, Hello, self.on_hello, None), (WORK, WorkRequest, self.on_work, None),
                (ROLLOUTS, RolloutPush, self.on_rollouts, PUSH_HANDLER_TIMEOUT_S),
                (ADAPTER, AdapterRequest, self.on_adapter, None),
                (STAGE_ADAPTER, StageAdapterRequest, self.on_stage_adapter, None),
                (STAGE_REPORT, StageReport, self.on_stage_report, None),
                (VALIDATE, ValidateResult, self.on_validate, None)]

    def register(self, host: SwarmHost) -> None:
        for protocol, msg_type, handler, timeout_s in self.handlers():
            host.set_handler(protocol, msg_type, handler, **({} if timeout_s is None else {"timeout_s": timeout_s}))

    def notify(self) -> None:
        """Wake everything waiting for a change (new work, new results, new version)."""
        self.changes.notify()

    async def wait_changed(self) -> None:
        await self.changes.wait()

    def _plan_changed(self) -> None:
        """A new plan: per-range adapter manifests for the ranges stage nodes serve (when the
        dissemination service runs), and wake the long polls (new assignments). The plan of the
        stage pipelines is printed when it changed (whole-model nodes are counted, not listed)."""
        if self.dissem is not None:
            try:
                self.dissem.set_layer_ranges(self.pipelines.ranges())
            except ValueError as e:  # the direct path keeps working
                log.warning("could not register pipeline layer ranges with dissemination: %s", e)
        if self.pipelines.has_stages():
            line = "pipelines: " + describe_pipelines(self.pipelines.summary(whole=False), self.roster.backends())
            if line != self._described:
                self._described = line
                log.info(line)
                if self.console is not None:
                    self.console(f"learner: {line}")
        self.notify()

    # -- the run ---------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.desk.done

    def publish(self, reply: AdapterReply) -> None:
        self.versions.add(reply)
        self.coordinator.set_version(reply.version)
        if self.dissem is not None:
            self.dissem.submit(reply)
        self.notify()

    def finish(self) -> None:
        if self.checks is not None:
            self.checks.close()  # the run needs no more verification; held groups stay untrained
        self.desk.finish()

    async def wait_nodes_told(self, active_within_s: float, timeout_s: float) -> None:
        """After :meth:`finish`: wait (bounded) until every recently active node has heard
        that the run is over, so none is left waiting on a closed learner."""
        with trio.move_on_after(timeout_s):
            while not self.roster.active(trio.current_time(), active_within_s) <= self.desk.told_done:
                await self.wait_changed()

    def statistics(self) -> ServiceStats:
        """A snapshot of every part, for readers (the dashboard)."""
        return ServiceStats(self.settings.run_id, self.done, self.roster.statistics(), self.coordinator.statistics(),
                            self.dissem.statistics() if self.dissem is not None else None, self.pipelines.roles(),
                            self.ledger.summary())

    def swarm_summary(self) -> dict[str, Any]:
        """Per-node figures for ``swarm.json`` (used by the capacity tool's validation), with each
        node's link role (relay or leaf, and why) when adapters are pushed."""
        links = self.dissem.link_summary() if self.dissem is not None else {}
        roles = links.get("roles", {})
        nodes = {p: {**row, **({"link_role": roles[p]["kind"], "link_why": roles[p]["why"]} if p in roles else {})}
                 for p, row in self.roster.summary().items()}
        return {"nodes": nodes, "pipelines": self.pipelines.summary(), "pipeline_plans": list(self.pipelines.history),
                "failovers": dict(self.coordinator.failovers), "work": self.ledger.summary(), "links": links}

    def take_contributions(self) -> dict[str, int]:
        """Completions accepted per node since the last call (a step's ``nodes`` row)."""
        return self.roster.take_contributions()

    def node_backends(self) -> dict[str, str]:
        """Peer id -> the generation backend it announced in its hello (``llamacpp``, ``torch``, ``mlx``)."""
        return self.roster.backends()

    def untrust(self, peer_id: str, reason: str) -> None:
        """Mark ``peer_id`` untrusted for the run: refused at join, leases revoked, its untrained
        groups (completed or held for verification) dropped (``unverified``) and pending again
        for other nodes."""
        self.ledger.untrusted(peer_id, reason)
        if self.admission is not None:
            self.admission.mark_untrusted(peer_id, reason)
        back = self.coordinator.revoke_peer(peer_id, "unverified")
        self.roster.untrust(peer_id, reason)
        log.warning("node %s is untrusted for the rest of the run (%s); %d group(s) re-issued",
                    short(peer_id), reason, len(back))
        self.notify()

    # -- handlers -----------------------------------------------------------------------------
    def _member(self, peer_id: str) -> None:
        """A request from ``peer_id``: refused unless it said hello (and is trusted)."""
        if self.roster.touch(peer_id, trio.current_time()) is None:
            shown, held = self._refusals_logged.allow(peer_id)
            if shown:  # a peer that keeps asking is logged once a minute
                log.warning("refused request from %s: it has not said hello%s", peer_id,
                            f" ({held} more refused since the last such line)" if held else "")
            raise Refused("say hello first")

    async def on_hello(self, msg: Hello, peer_id: str) -> HelloAck:
        return await self.hello.on_hello(msg, peer_id)

    async def on_work(self, msg: WorkRequest, peer_id: str) -> WorkReply:
        self._member(peer_id)
        if self.pipelines.is_stage(peer_id) or self.roster.stage_model(peer_id) is not None:
            if not self.pipelines.is_stage(peer_id):  # dropped from the plan (lost or silent), back now
                self.hello.rejoin_stage(peer_id, trio.current_time())
            return await self.desk.stage_work(msg, peer_id)
        return await self.desk.node_work(msg, peer_id, first=lambda: self._job_reply(peer_id))

    def _job_reply(self, peer_id: str) -> WorkReply | None:
        """A validation job waiting for ``peer_id``, as a work reply (before any lease)."""
        job = self.validators.job_for(peer_id) if self.validators is not None else None
        return None if job is None else WorkReply(validate=job, retry_after_s=0.0, reason="validate")

    async def on_validate(self, msg: ValidateResult, peer_id: str) -> ValidateAck:
        """A validator's replay of a job it was handed (``learner/validator_desk.py``)."""
        self._member(peer_id)
        return ValidateAck(accepted=self.validators is not None and self.validators.deliver(peer_id, msg))

    async def on_rollouts(self, msg: RolloutPush, peer_id: str) -> RolloutAck:
        self._member(peer_id)
        return self.pushes.on_rollouts(msg, peer_id, trio.current_time())

    async def on_adapter(self, msg: AdapterRequest, peer_id: str) -> AdapterReply:
        self._member(peer_id)
        return self.published(msg.version)

    def published(self, version: int) -> AdapterReply:
        """Published adapter ``version`` (-1: the newest); :class:`Refused` if it is not kept."""
        try:
            return self.versions.get(version)
        except LookupError as e:
            raise Refused(str(e)) from e

    async def on_stage_adapter(self, msg: StageAdapterRequest, peer_id: str) -> AdapterReply:
        self._member(peer_id)
        try:
            return stage_adapter(self.published(msg.version), msg)
        except ValueError as e:  # Refused included
            raise Refused(str(e)) from e

    async def on_stage_report(self, msg: StageReport, peer_id: str) -> StageReportAck:
        self._member(peer_id)
        ack, lost = stage_report(self.pipelines, self.coordinator, msg, peer_id)
        self.notify()  # the re-leased groups first; the probes may take a while
        for peer in lost:
            if self.probe is not None and await self.probe(peer):
                log.warning("pipeline head %s reported %s lost, but it answers the learner: kept",
                            short(peer_id), short(peer))
            elif self.pipelines.is_stage(peer):
                self.pipelines.leave(peer, trio.current_time(), "lost")
        self.notify()
        return ack

    # -- background work --------------------------------------------------------------------
    async def verify_loop(self) -> None:
        """Re-score held pushes after their ack (``learner/verify_queue.py``) until the run is done."""
        if self.checks is not None:
            await self.checks.run()

    async def expiry_loop(self) -> None:
        """Re-issue the groups of leases whose deadline passed (a node died or froze), and wake
        the long polls when a group held by a peer on probation may be backed up."""
        while not self.done:
            now = trio.current_time()
            times = [t for t in (self.coordinator.next_deadline(), self.coordinator.next_backup_at(now)) if t is not None]
            with trio.move_on_at(min(times, default=float("inf"))):
                await self.wait_changed()
                continue
            requeued = self.coordinator.expire(trio.current_time())
            if requeued:
                log.warning("lease expired: re-issuing %d group(s): %s", len(requeued), ", ".join(requeued))
            self.notify()


def short(peer_id: str) -> str:
    """Short form of a peer id for console lines."""
    return peer_id[-6:]
