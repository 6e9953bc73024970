"""The learner's network face: join, work leases, rollout pushes and adapter fetches.

A thin layer between the libp2p host and the pure :class:`~learner.coordinator.Coordinator`,
built whole: every collaborator is a constructor argument, and the parts it owns are built
from them in the constructor.

- hello (``HELLO``): run name, admission (``learner/admission.py``), model identity
  (``learner/model_serve.py``) and the pipeline planner decide whether a node may join;
- work (``WORK``): :class:`~learner.work_desk.WorkDesk` decides a node's next work;
- rollouts (``ROLLOUTS``): the coordinator accepts or rejects each group; picked pushes are
  held for verification (:class:`~learner.verify_queue.VerifyQueue`) after their ack;
- adapters (``ADAPTER``, ``STAGE_ADAPTER``): :class:`~learner.adapter_versions.AdapterVersions`;
- stage reports (``STAGE_REPORT``): :func:`learner.pipelines.stage_report`.

Nodes must say hello before anything else; a stranger's work request or push is refused
with a logged reason and changes nothing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import trio

from learner.adapter_versions import AdapterVersions
from learner.admission import Admission
from learner.changes import Changes
from learner.coordinator import Coordinator
from learner.dissem import LearnerDissem
from learner.episodes import EpisodeSettings
from learner.lease_gate import GateSettings, LeaseGate
from learner.ledger import WorkLedger
from learner.model_serve import HELLO_MODEL_NAME_KEY, LearnerModelServe, hello_model_check
from learner.pipelines import PipelineManager, PipelineSettings, describe_pipelines, stage_adapter, stage_report
from learner.validator_desk import ValidatorConfig, ValidatorDesk
from learner.validators import device_class
from learner.verify import Verifier
from learner.verify_queue import VerifyQueue
from learner.work_desk import SamplingDefaults, WorkDesk
from swarm.discovery.keys import run_mismatch
from swarm.proto import ADAPTER, HELLO, ROLLOUTS, WORK
from swarm.proto.adapter import AdapterReply, AdapterRequest
from swarm.proto.hello import Hello, HelloAck
from swarm.proto.rollouts import RolloutAck, RolloutPush
from swarm.proto.validate import VALIDATE, ValidateAck, ValidateResult
from swarm.proto.stage import STAGE_ADAPTER, STAGE_REPORT, StageAdapterRequest, StageReport
from swarm.proto.work import WorkReply, WorkRequest

__all__ = ["LearnerService", "NodeInfo", "Refused", "SamplingDefaults", "ServiceSettings", "short"]

log = logging.getLogger("echo_swarm.learner")

#: Seconds a rollout push may take to be handled. The handler only validates and records the
#: push (verification runs after the ack, ``learner/verify_queue.py``), but a push is the
#: largest request a node sends, so it gets twice the host's default handler deadline; a node
#: waits ``NodeConfig.push_timeout_s`` (longer) for the ack.
PUSH_HANDLER_TIMEOUT_S = 60.0
#: A node silent this long (no request) and holding no lease is forgotten: one that never
#: contributed entirely (a passing stranger leaves nothing behind), one that did keeps its
#: figures for the run's summary but not its hello's free-form fields (s).
IDLE_FORGET_S = 600.0


class Refused(ValueError):
    """A request the learner will not serve (the peer receives the message)."""


@dataclass
class NodeInfo:
    peer_id: str
    hello: Hello
    joined_at: float
    last_seen: float
    groups_pushed: int = 0
    completions_pushed: int = 0
    rejected_groups: int = 0
    gen_tokens: int = 0
    gen_s: float = 0.0


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
    gate: GateSettings = field(default_factory=GateSettings)
    #: How the pipelines of stage nodes are planned (the ``[pipeline]`` config section).
    pipeline: PipelineSettings = field(default_factory=PipelineSettings)


class LearnerService:
    """The handlers of every learner protocol over the coordinator and its parts.

    Optional collaborators (None = the feature is off): ``admission`` (None: anyone may join,
    no caps), ``verifier`` (None: pushes are not re-scored; else :meth:`verify_loop` must run),
    ``episode`` (multi-turn runs: the settings every lease carries), ``dissem`` (None: adapters
    by direct fetch only), ``model_serve`` (the base model's server, for the run's summary),
    ``console`` (where each new plan of stage pipelines is printed), ``probe`` (the learner's own
    check of a stage a pipeline head reports lost).
    """

    def __init__(self, coordinator: Coordinator, settings: ServiceSettings, *,
                 versions: AdapterVersions | None = None, nodes: dict[str, NodeInfo] | None = None,
                 admission: Admission | None = None, verifier: Verifier | None = None,
                 episode: EpisodeSettings | None = None, dissem: LearnerDissem | None = None,
                 model_serve: LearnerModelServe | None = None,
                 console: Callable[[str], None] | None = None,
                 probe: Callable[[str], Awaitable[bool]] | None = None,
                 ledger: WorkLedger | None = None, replay: Any = None,
                 validators: ValidatorConfig | None = None) -> None:
        self.coordinator = coordinator
        self.settings = settings
        self.versions = versions if versions is not None else AdapterVersions()
        #: Peers that said hello, by peer id (shared with the dissemination service's admit check).
        self.nodes = nodes if nodes is not None else {}
        self.admission = admission
        self.verifier = verifier
        self.episode = episode
        self.dissem = dissem
        self.model_serve = model_serve
        #: Where a new plan of stage pipelines is shown to the operator (None: logged only).
        self.console = console
        #: The learner's own probe of a stage a head reported lost (``learner.pipelines.stage_alive``);
        #: None: the head's report alone is taken as evidence (harnesses without a host).
        self.probe = probe
        #: Work per node over the run (``learner/ledger.py``): pushed, verified by which test, trained.
        self.ledger = ledger if ledger is not None else WorkLedger()
        #: Completions accepted per peer since the last :meth:`take_contributions`.
        self.contributions: dict[str, int] = {}
        self.changes = Changes()
        s = settings
        self.pipelines = PipelineManager(s.group_size, s.sampling.max_tokens, s.pipeline, on_plan=self._plan_changed,
                                         links=dissem.link_snapshot if dissem is not None else None)
        self.desk = WorkDesk(coordinator, self.pipelines, LeaseGate(s.gate), self.changes, sampling=s.sampling,
                             group_size=s.group_size, long_poll_s=s.long_poll_s, admission=admission, episode=episode,
                             speed_of=lambda peer: self.nodes[peer].hello.tokens_per_s if peer in self.nodes else 0.0)
        #: Validator nodes for numerics the learner cannot replay (``learner/validator_desk.py``).
        self.validators = None if verifier is None or validators is None or not validators.enabled else ValidatorDesk(
            validators, s.sampling, classes=self.node_classes, untrust=self.untrust, wake=self.changes.notify)
        self.checks = None if verifier is None else VerifyQueue(
            verifier, coordinator, self.changes, backend_of=self._backend_of, untrust=self.untrust, credit=self.credit,
            replay=replay, on_checked=self.ledger.checked, validators=self.validators)

    # -- wiring ----------------------------------------------------------------------------
    def register(self, host) -> None:
        host.set_handler(HELLO, Hello, self.on_hello_named)
        host.set_handler(WORK, WorkRequest, self.on_work)
        host.set_handler(ROLLOUTS, RolloutPush, self.on_rollouts, timeout_s=PUSH_HANDLER_TIMEOUT_S)
        host.set_handler(ADAPTER, AdapterRequest, self.on_adapter)
        host.set_handler(STAGE_ADAPTER, StageAdapterRequest, self.on_stage_adapter)
        host.set_handler(STAGE_REPORT, StageReport, self.on_stage_report)
        host.set_handler(VALIDATE, ValidateResult, self.on_validate)

    def notify(self) -> None:
        """Wake everything waiting for a change (new work, new results, new version)."""
        self.changes.notify()

    async def wait_changed(self) -> None:
        await self.changes.wait()

    def _plan_changed(self) -> None:
        """A new plan: per-range adapter manifests for the ranges stage nodes serve (when the
        dissemination service runs), and wake the long polls (new assignments)."""
        if self.dissem is not None:
            try:
                self.dissem.set_layer_ranges(self.pipelines.ranges())
            except Exception as e:  # the direct path keeps working
                log.warning("could not register pipeline layer ranges with dissemination: %s", e)
        if self.pipelines.has_stages():
            line = "pipelines: " + describe_pipelines(self.pipelines.summary(), self.node_backends())
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
            while True:
                now = trio.current_time()
                active = {p for p, n in self.nodes.items() if now - n.last_seen <= active_within_s}
                if active <= self.desk.told_done:
                    return
                await self.wait_changed()

    def swarm_summary(self) -> dict:
        """Per-node figures for ``swarm.json`` (used by the capacity tool's validation), with each
        node's link role (relay or leaf, and why) when adapters are pushed."""
        links = self.dissem.link_summary() if self.dissem is not None else {}
        roles = links.get("roles", {})
        return {"nodes": {p: {
            "backend": n.hello.backend, "device": n.hello.device, "tokens_per_s": n.hello.tokens_per_s,
            "memory_bytes": n.hello.memory_bytes, "name": n.hello.name, "groups": n.groups_pushed, "completions": n.completions_pushed,
            "rejected_groups": n.rejected_groups, "gen_s": round(n.gen_s, 3), "gen_tokens": n.gen_tokens,
            **({"link_role": roles[p]["kind"], "link_why": roles[p]["why"]} if p in roles else {}),
        } for p, n in self.nodes.items()}, "pipelines": self.pipelines.summary(),
            "pipeline_plans": self.pipelines.history[-50:], "failovers": dict(self.coordinator.failovers),
            "work": self.ledger.summary(),
            "links": links}

    def credit(self, peer_id: str, completions: int) -> None:
        """Count ``completions`` of ``peer_id`` as accepted (a push, or a held push once verified)."""
        if completions:
            self.contributions[peer_id] = self.contributions.get(peer_id, 0) + completions

    def take_contributions(self) -> dict[str, int]:
        out, self.contributions = self.contributions, {}
        return out

    def node_backends(self) -> dict[str, str]:
        """Peer id -> the generation backend it announced in its hello (``llamacpp``, ``torch``, ``mlx``)."""
        return {peer: info.hello.backend for peer, info in self.nodes.items()}

    def forget_idle(self, now: float) -> list[str]:
        """Forget nodes silent for :data:`IDLE_FORGET_S` that hold no lease (see there); returns
        the peers forgotten entirely. Keeps ``nodes`` bounded by the live and contributing ones."""
        busy = {le.peer_id for le in self.coordinator.leases.values()}
        gone = []
        for peer, n in list(self.nodes.items()):
            if now - n.last_seen <= IDLE_FORGET_S or peer in busy or self.pipelines.is_stage(peer):
                continue
            if n.groups_pushed == 0:
                del self.nodes[peer]
                gone.append(peer)
            elif n.hello.extra or n.hello.addrs:
                h = n.hello
                n.hello = Hello(backend=h.backend, device=h.device, memory_bytes=h.memory_bytes,
                                tokens_per_s=h.tokens_per_s, name=h.name)
        return gone

    def node_classes(self) -> dict[str, str | None]:
        """Peer id -> the validator class its hello declares (``learner.validators.device_class``;
        None: not one validators serve). Stage nodes serve pipelines, not validation jobs."""
        return {p: None if n.hello.extra.get("stage") == "1" else device_class(n.hello.backend, n.hello.device, n.hello.extra)
                for p, n in self.nodes.items()}

    def _backend_of(self, peer_id: str) -> str:
        node = self.nodes.get(peer_id)
        return node.hello.backend if node is not None else ""

    def untrust(self, peer_id: str, reason: str) -> None:
        """Mark ``peer_id`` untrusted for the run: refused at join, leases revoked, its untrained
        groups (completed or held for verification) dropped (``unverified``) and pending again
        for other nodes."""
        self.ledger.untrusted(peer_id, reason)
        if self.admission is not None:
            self.admission.mark_untrusted(peer_id, reason)
        back = self.coordinator.revoke_peer(peer_id, "unverified")
        self.nodes.pop(peer_id, None)
        log.warning("node %s is untrusted for the rest of the run (%s); %d group(s) re-issued",
                    short(peer_id), reason, len(back))
        self.notify()

    # -- handlers -----------------------------------------------------------------------------
    def _node(self, peer_id: str) -> NodeInfo:
        node = self.nodes.get(peer_id)
        if node is None:
            log.warning("refused request from %s: it has not said hello", peer_id)
            raise Refused("say hello first")
        node.last_seen = trio.current_time()
        return node

    def _refusal(self, reason: str, **extra) -> HelloAck:
        s = self.settings
        return HelloAck(accepted=False, run_id=s.run_id, model=s.model_name, current_version=0, reason=reason, **extra)

    async def on_hello_named(self, msg: Hello, peer_id: str) -> HelloAck:
        """:meth:`on_hello` behind the run-name check (a node that asked for another run is
        refused); every ack carries the run's name."""
        why = run_mismatch(msg.run_name, self.settings.run_name)
        if why:
            log.warning("refused node %s: %s", short(peer_id), why)
            ack = self._refusal(why)
        else:
            ack = await self.on_hello(msg, peer_id)
        ack.run_name = self.settings.run_name
        return ack

    async def on_hello(self, msg: Hello, peer_id: str) -> HelloAck:
        s = self.settings
        if self.admission is not None:  # learner/admission.py: allowlist, join token, untrusted
            decision = self.admission.on_hello(peer_id, msg.join_token, time.time())
            if not decision.accepted:
                log.warning("refused node %s: %s", short(peer_id), decision.reason)
                return self._refusal(decision.reason, retry_after_s=decision.retry_after_s)
        reason = hello_model_check(msg.model_sha256, msg.extra.get(HELLO_MODEL_NAME_KEY, ""),
                                   s.model_sha256, s.model_name)
        if reason:
            log.warning("refused node %s: %s", short(peer_id), reason)
            return self._refusal(reason, model_sha256=s.model_sha256)
        now = trio.current_time()
        try:
            self.pipelines.join(peer_id, msg, now)
        except ValueError as e:
            log.warning("refused node %s: %s", short(peer_id), e)
            return self._refusal(str(e))
        self.forget_idle(now)
        known = peer_id in self.nodes
        self.nodes[peer_id] = NodeInfo(peer_id, msg, joined_at=now, last_seen=now)
        if known:
            # A node that re-joins has lost whatever it was generating.
            self.coordinator.release_peer(peer_id)
            self.notify()
        log.info(
            "node %s%s %s: backend=%s device=%s mem=%.1f GiB %.0f tok/s", short(peer_id),
            f" ({msg.name})" if msg.name else "", "re-joined" if known else "joined", msg.backend, msg.device,
            msg.memory_bytes / 2**30, msg.tokens_per_s,
        )
        return HelloAck(accepted=True, run_id=s.run_id, model=s.model_name, current_version=self.versions.newest(),
                        model_sha256=s.model_sha256,  # a private run's membership ticket (swarm/membership.py):
                        ticket=self.model_serve.ticket_for(peer_id) if self.model_serve is not None else None)

    async def on_work(self, msg: WorkRequest, peer_id: str) -> WorkReply:
        node = self._node(peer_id)
        if self.pipelines.is_stage(peer_id) or node.hello.extra.get("stage") == "1":
            if not self.pipelines.is_stage(peer_id):  # dropped from the plan (lost or silent), back now
                self.pipelines.join(peer_id, node.hello, trio.current_time())
            return await self.desk.stage_work(msg, peer_id)
        return await self.desk.node_work(msg, peer_id, first=lambda: self._job_reply(peer_id))

    def _job_reply(self, peer_id: str) -> WorkReply | None:
        """A validation job waiting for ``peer_id``, as a work reply (before any lease)."""
        job = self.validators.job_for(peer_id) if self.validators is not None else None
        return None if job is None else WorkReply(validate=job, retry_after_s=0.0, reason="validate")

    async def on_validate(self, msg: ValidateResult, peer_id: str) -> ValidateAck:
        """A validator's replay of a job it was handed (``learner/validator_desk.py``)."""
        self._node(peer_id)
        return ValidateAck(accepted=self.validators is not None and self.validators.deliver(peer_id, msg))

    async def on_rollouts(self, msg: RolloutPush, peer_id: str) -> RolloutAck:
        node = self._node(peer_id)
        refusal = self.admission and self.admission.push_refusal(peer_id, trio.current_time())
        if refusal:
            rejected = self.coordinator.refuse_push(peer_id, msg.lease_id, [g.group_id for g in msg.groups], refusal)
            log.warning("refused a push of %d group(s) from %s: %s", len(rejected), short(peer_id), refusal)
            self.notify()
            return RolloutAck(accepted_groups=0, rejected_groups=len(rejected), rejections=rejected)
        accepted, rejected = self.coordinator.submit(peer_id, msg.lease_id, msg.groups, trio.current_time())
        by_id = {g.group_id: g for g in msg.groups}
        # picked for re-scoring: the push's groups are held until the verify queue has checked
        # them (a failure untrusts the peer and re-issues them); the ack does not wait for it
        held = self.checks.hold(peer_id, accepted, by_id) if self.checks is not None else None
        n_completions = sum(len(by_id[g].completions) for g in accepted)
        node.groups_pushed += len(accepted)
        node.completions_pushed += n_completions
        node.rejected_groups += len(rejected)
        node.gen_tokens += msg.gen_tokens
        node.gen_s += msg.gen_s
        self.ledger.pushed(peer_id, node.hello.backend, len(accepted), len(rejected), msg.gen_tokens, node.hello.name)
        if held is None:
            self.credit(peer_id, n_completions)
        for gid, reason in rejected.items():
            back = " (pending again)" if self.coordinator.ledger.get(gid) == "pending" else ""
            log.warning("rejected group %s from %s: %s%s", gid, short(peer_id), reason, back)
        self.notify()
        return RolloutAck(accepted_groups=len(accepted), rejected_groups=len(rejected), rejections=rejected)

    async def on_adapter(self, msg: AdapterRequest, peer_id: str) -> AdapterReply:
        self._node(peer_id)
        return self.published(msg.version)

    def published(self, version: int) -> AdapterReply:
        """Published adapter ``version`` (-1: the newest); :class:`Refused` if it is not kept."""
        try:
            return self.versions.get(version)
        except LookupError as e:
            raise Refused(str(e)) from e

    async def on_stage_adapter(self, msg: StageAdapterRequest, peer_id: str) -> AdapterReply:
        self._node(peer_id)
        try:
            return stage_adapter(self.published(msg.version), msg)
        except ValueError as e:  # Refused included
            raise Refused(str(e)) from e

    async def on_stage_report(self, msg: StageReport, peer_id: str):
        self._node(peer_id)
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
