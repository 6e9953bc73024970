"""The learner's network face: join, work leases, rollout pushes and adapter fetches.

A thin layer between the libp2p host and the pure :class:`~learner.coordinator.Coordinator`.
Nodes must say hello before anything else; a stranger's work request or push is refused
with a logged reason and changes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import trio

from learner.coordinator import Coordinator
from learner.pipelines import PipelineManager, on_stage_report, stage_adapter, stage_work
from learner.verify_queue import CheckQueue, hold_for_check, run_checks
from swarm.proto import ADAPTER, HELLO, ROLLOUTS, WORK
from swarm.proto.adapter import AdapterReply, AdapterRequest
from swarm.proto.hello import Hello, HelloAck
from swarm.proto.rollouts import RolloutAck, RolloutPush
from swarm.proto.stage import STAGE_ADAPTER, STAGE_REPORT, StageAdapterRequest, StageReport
from swarm.proto.work import Lease, PromptGroup, Sampling, WorkReply, WorkRequest

log = logging.getLogger("echo_swarm.learner")

#: How many published adapter versions are kept for nodes that are a little behind.
KEEP_ADAPTER_VERSIONS = 4
#: Seconds a rollout push may take to be handled. The handler only validates and records the
#: push (verification runs after the ack, ``learner/verify_queue.py``), but a push is the
#: largest request a node sends, so it gets twice the host's default handler deadline; a node
#: waits ``NodeConfig.push_timeout_s`` (longer) for the ack.
PUSH_HANDLER_TIMEOUT_S = 60.0


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
class SamplingDefaults:
    temperature: float
    top_p: float
    max_tokens: int
    seed: int


@dataclass
class LearnerService:
    coordinator: Coordinator
    sampling: SamplingDefaults
    group_size: int
    run_id: str
    model_name: str
    long_poll_s: float
    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    adapters: dict[int, AdapterReply] = field(default_factory=dict)
    #: Completions accepted per peer since the last :meth:`take_contributions`.
    contributions: dict[str, int] = field(default_factory=dict)
    done: bool = False
    #: Peers that have been told the run is over.
    told_done: set[str] = field(default_factory=set)
    #: Hold back every lease until this many distinct nodes wait for work at the same time, so
    #: that each node of a mixed swarm gets a share of the first step (the fastest one would
    #: otherwise take everything before the slow ones have loaded). 0 = off. Once open, it stays open.
    min_waiting: int = 0
    #: The adapter dissemination service (``learner.dissem.LearnerDissem``); None = direct fetch only.
    dissem: Any = None
    #: Content hash of the run's base model (``swarm.content.model_id``); a node whose hello
    #: names another is refused. Empty = no check.
    model_sha256: str = ""
    #: The base-model server (``learner.model_serve.LearnerModelServe``): manifest, chunks, holders.
    model_serve: Any = None
    #: Multi-turn runs: the episode settings every lease carries (``learner.episodes.EpisodeSettings``);
    #: None = single-turn leases.
    episode: Any = None
    #: Who may join and how much each peer may ask (``learner.admission.Admission``); None = anyone, no caps.
    admission: Any = None
    #: Rollout verification (``learner.verify.Verifier``); None = pushes are not re-scored. Picked
    #: pushes are held and re-scored after their ack by :meth:`verify_loop`, which must run.
    verifier: Any = None
    #: The run's name (``learner.identity.run_name``): in every hello ack; a node that asked
    #: for another run (``--run``) is refused. Empty = no check.
    run_name: str = ""
    #: Close the ``min_waiting`` gate again at every new adapter version (each step's work is
    #: then shared among that many waiting nodes, e.g. a slow pipeline beside a fast node);
    #: a gate waits at most ``gate_timeout_s`` for them.
    regate_each_version: bool = False
    gate_timeout_s: float = 30.0
    #: Pipelines of stage nodes (``learner.pipelines``); built from ``pipeline_settings``.
    pipeline_settings: Any = None
    pipelines: Any = None

    def __post_init__(self) -> None:
        self._changed = trio.Event()
        self._waiting: set[str] = set()
        self._gate_open = False
        self._gate_version = 0
        self._gate_deadline: float | None = None
        #: Held pushes waiting for verification (``learner/verify_queue.py``).
        self.checks = CheckQueue()
        if self.pipelines is None:
            self.pipelines = PipelineManager(self.group_size, self.sampling.max_tokens, self.pipeline_settings)
        self.pipelines.on_plan = self._plan_changed

    def _plan_changed(self) -> None:
        """A new plan: per-range adapter manifests for the ranges stage nodes serve (when the
        dissemination service offers them), and wake the long polls (new assignments)."""
        setter = getattr(self.dissem, "set_layer_ranges", None)
        if setter is not None:
            try:
                setter(self.pipelines.ranges())
            except Exception as e:  # the direct path keeps working
                log.warning("could not register pipeline layer ranges with dissemination: %s", e)
        self.notify()

    # -- wiring ----------------------------------------------------------------------------
    def register(self, host) -> None:
        host.set_handler(HELLO, Hello, self.on_hello_named)
        host.set_handler(WORK, WorkRequest, self.on_work)
        host.set_handler(ROLLOUTS, RolloutPush, self.on_rollouts, timeout_s=PUSH_HANDLER_TIMEOUT_S)
        host.set_handler(ADAPTER, AdapterRequest, self.on_adapter)
        host.set_handler(STAGE_ADAPTER, StageAdapterRequest, self.on_stage_adapter)
        host.set_handler(STAGE_REPORT, StageReport, self.on_stage_report)

    def notify(self) -> None:
        """Wake everything waiting for a change (new work, new results, new version)."""
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    # -- publishing -----------------------------------------------------------------------
    def publish(self, reply: AdapterReply) -> None:
        self.adapters[reply.version] = reply
        for v in sorted(self.adapters)[:-KEEP_ADAPTER_VERSIONS]:
            del self.adapters[v]
        self.coordinator.set_version(reply.version)
        if self.dissem is not None:
            self.dissem.submit(reply)
        self.notify()

    def finish(self) -> None:
        self.done = True
        self.checks.close()  # the run needs no more verification; held groups stay untrained
        self.notify()

    async def wait_nodes_told(self, active_within_s: float, timeout_s: float) -> None:
        """After :meth:`finish`: wait (bounded) until every recently active node has heard
        that the run is over, so none is left waiting on a closed learner."""
        with trio.move_on_after(timeout_s):
            while True:
                now = trio.current_time()
                active = {p for p, n in self.nodes.items() if now - n.last_seen <= active_within_s}
                if active <= self.told_done:
                    return
                await self.wait_changed()

    def swarm_summary(self) -> dict:
        """Per-node figures for ``swarm.json`` (used by the capacity tool's validation)."""
        return {"nodes": {p: {
            "backend": n.hello.backend, "device": n.hello.device, "tokens_per_s": n.hello.tokens_per_s,
            "memory_bytes": n.hello.memory_bytes, "groups": n.groups_pushed, "completions": n.completions_pushed,
            "rejected_groups": n.rejected_groups, "gen_s": round(n.gen_s, 3), "gen_tokens": n.gen_tokens,
        } for p, n in self.nodes.items()}, "pipelines": self.pipelines.summary(),
            "pipeline_plans": self.pipelines.history[-50:], "failovers": dict(self.coordinator.failovers)}

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

    def _gate_closed(self) -> bool:
        now = trio.current_time()
        if self.regate_each_version and self.coordinator.version != self._gate_version:
            self._gate_version, self._gate_open = self.coordinator.version, False
            self._gate_deadline = now + self.gate_timeout_s
        late = self._gate_deadline is not None and now >= self._gate_deadline
        if self._gate_open or late or len(self._waiting) >= self.min_waiting:
            if not self._gate_open:
                self._gate_open = True
                self.notify()
            return False
        return True

    # -- handlers -----------------------------------------------------------------------------
    def _node(self, peer_id: str) -> NodeInfo:
        node = self.nodes.get(peer_id)
        if node is None:
            log.warning("refused request from %s: it has not said hello", peer_id)
            raise Refused("say hello first")
        node.last_seen = trio.current_time()
        return node

    async def on_hello_named(self, msg: Hello, peer_id: str) -> HelloAck:
        """:meth:`on_hello` behind the run-name check (a node that asked for another run is
        refused); every ack carries the run's name."""
        from swarm.discovery.keys import run_mismatch

        why = run_mismatch(msg.run_name, self.run_name)
        if why:
            log.warning("refused node %s: %s", short(peer_id), why)
            ack = HelloAck(accepted=False, run_id=self.run_id, model=self.model_name, current_version=0, reason=why)
        else:
            ack = await self.on_hello(msg, peer_id)
        ack.run_name = self.run_name
        return ack

    async def on_hello(self, msg: Hello, peer_id: str) -> HelloAck:
        if self.admission is not None:  # learner/admission.py: allowlist, join token, untrusted
            import time

            decision = self.admission.on_hello(peer_id, msg.join_token, time.time())
            if not decision.accepted:
                log.warning("refused node %s: %s", short(peer_id), decision.reason)
                return HelloAck(accepted=False, run_id=self.run_id, model=self.model_name, current_version=0,
                                reason=decision.reason, retry_after_s=decision.retry_after_s)
        from learner.model_serve import HELLO_MODEL_NAME_KEY, hello_model_check

        reason = hello_model_check(msg.model_sha256, msg.extra.get(HELLO_MODEL_NAME_KEY, ""),
                                   self.model_sha256, self.model_name)
        if reason:
            log.warning("refused node %s: %s", short(peer_id), reason)
            return HelloAck(accepted=False, run_id=self.run_id, model=self.model_name, current_version=0,
                            reason=reason, model_sha256=self.model_sha256)
        now = trio.current_time()
        try:
            self.pipelines.join(peer_id, msg, now)
        except ValueError as e:
            log.warning("refused node %s: %s", short(peer_id), e)
            return HelloAck(accepted=False, run_id=self.run_id, model=self.model_name, current_version=0,
                            reason=str(e))
        known = peer_id in self.nodes
        self.nodes[peer_id] = NodeInfo(peer_id, msg, joined_at=now, last_seen=now)
        if known:
            # A node that re-joins has lost whatever it was generating.
            self.coordinator.release_peer(peer_id)
            self.notify()
        log.info(
            "node %s %s: backend=%s device=%s mem=%.1f GiB %.0f tok/s",
            short(peer_id), "re-joined" if known else "joined", msg.backend, msg.device,
            msg.memory_bytes / 2**30, msg.tokens_per_s,
        )
        current = max(self.adapters, default=0)
        return HelloAck(accepted=True, run_id=self.run_id, model=self.model_name, current_version=current,
                        model_sha256=self.model_sha256)

    async def on_work(self, msg: WorkRequest, peer_id: str) -> WorkReply:
        node = self._node(peer_id)
        if self.pipelines.is_stage(peer_id) or node.hello.extra.get("stage") == "1":
            if not self.pipelines.is_stage(peer_id):  # dropped from the plan (lost or silent), back now
                self.pipelines.join(peer_id, node.hello, trio.current_time())
            return await stage_work(self, msg, peer_id)
        self._waiting.add(peer_id)
        if not self._gate_open:
            self.notify()  # waiters re-count
        return await self.long_poll(peer_id, lambda: self.lease_reply(peer_id, msg.max_groups))

    async def long_poll(self, peer_id: str, attempt: Callable[[], WorkReply | None]) -> WorkReply:
        """Answer a work long poll: ``attempt()`` (a reply, or None to wait for the next change)
        until the run is done or ``long_poll_s`` passes; ``peer_id`` leaves the waiters after."""
        try:
            with trio.move_on_after(self.long_poll_s):
                while True:
                    if self.done:
                        self.told_done.add(peer_id)
                        self.notify()
                        return WorkReply(done=True, reason="done")
                    reply = attempt()
                    if reply is not None:
                        return reply
                    await self.wait_changed()
        finally:
            self._waiting.discard(peer_id)
        return WorkReply(retry_after_s=0.0, reason="no_work")

    def lease_reply(self, peer_id: str, max_groups: int, limit: int | None = None,
                    stage: Callable[[Any], Any] | None = None) -> WorkReply | None:
        """A lease for ``peer_id`` (admission caps and the sequential gate permitting), with
        ``stage(record)`` attached for a pipeline head; None when there is nothing to lease."""
        capped = self.admission and self.admission.lease_refusal(
            peer_id, sum(le.peer_id == peer_id for le in self.coordinator.leases.values()))
        if capped:
            return WorkReply(retry_after_s=self.long_poll_s, reason=capped)
        if self._gate_closed():
            return None
        record = self.coordinator.lease(peer_id, max_groups, trio.current_time(), limit=limit)
        if record is None:
            return None
        self.notify()
        return WorkReply(lease=self._lease_message(record), stage=stage(record) if stage else None)

    def _lease_message(self, record) -> Lease:
        s = self.sampling
        ep, specs = self.episode, self.coordinator.specs
        groups = [PromptGroup(gid, specs[gid].prompt_ids, *(("train", int(specs[gid].problem_ref)) if ep else ()))
                  for gid in record.group_ids]
        return Lease(
            lease_id=record.lease_id,
            version=record.version,
            group_size=self.group_size,
            sampling=Sampling(s.temperature, s.top_p, s.max_tokens, s.seed),
            groups=groups,
            deadline_s=record.deadline - record.issued_at,
            **(ep.lease_fields() if ep else {}),
        )

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
        # picked for re-scoring: the push's groups are held until verify_loop has checked them
        # (a failure untrusts the peer and re-issues them); the ack does not wait for it
        held = hold_for_check(self, peer_id, accepted, by_id)
        n_completions = sum(len(by_id[g].completions) for g in accepted)
        node.groups_pushed += len(accepted)
        node.completions_pushed += n_completions
        node.rejected_groups += len(rejected)
        node.gen_tokens += msg.gen_tokens
        node.gen_s += msg.gen_s
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
        if not self.adapters:
            raise Refused("no adapter published yet")
        version = max(self.adapters) if version < 0 else version
        reply = self.adapters.get(version)
        if reply is None:
            raise Refused(f"adapter version {version} is not available (have {sorted(self.adapters)})")
        return reply

    async def on_stage_adapter(self, msg: StageAdapterRequest, peer_id: str) -> AdapterReply:
        self._node(peer_id)
        try:
            return stage_adapter(self, msg)
        except ValueError as e:
            raise Refused(str(e)) from e

    async def on_stage_report(self, msg: StageReport, peer_id: str):
        self._node(peer_id)
        return on_stage_report(self, msg, peer_id)

    async def verify_loop(self) -> None:
        """Re-score held pushes after their ack (``learner/verify_queue.py``) until the run is done."""
        await run_checks(self)

    async def expiry_loop(self) -> None:
        """Re-issue the groups of leases whose deadline passed (a node died or froze)."""
        while not self.done:
            deadline = self.coordinator.next_deadline()
            with trio.move_on_at(deadline if deadline is not None else float("inf")):
                await self.wait_changed()
                continue
            requeued = self.coordinator.expire(trio.current_time())
            if requeued:
                log.warning("lease expired: re-issuing %d group(s): %s", len(requeued), ", ".join(requeued))
                self.notify()


def short(peer_id: str) -> str:
    """Short form of a peer id for console lines."""
    return peer_id[-6:]
