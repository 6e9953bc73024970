"""Where a node's next work is decided: the work long poll of whole-model nodes and of stage
nodes (pipeline heads and the stages they drive).

A node asks for work (``WORK``); the desk answers at once when it can, otherwise waits for a
change (:class:`~swarm.changes.Changes`) until the run is over or ``long_poll_s`` passes:

1. the run is done -> ``done``;
2. a stage node whose assignment changed (another layer range, pipeline or adapter version)
   -> its new :class:`~swarm.proto.stage.StageAssignment` (:meth:`PipelineManager.update_for`);
3. admission caps (``learner/admission.py``) -> a refusal with a retry time;
4. the fair-start gate is closed (:mod:`learner.lease_gate`) -> wait;
5. a pipeline head whose stages do not all hold the current version
   (:meth:`PipelineManager.may_lease`) -> wait;
6. the coordinator has groups to lease (:meth:`Coordinator.lease`: staleness bound, groups in
   flight) -> a :class:`~swarm.proto.work.Lease` carrying the sampling settings (and the
   episode settings of a multi-turn run, and a head's route);
7. else wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import trio

from learner.admission import Admission
from swarm.changes import Changes
from learner.coordinator import Coordinator
from learner.episodes import EpisodeSettings
from learner.group_ledger import LeaseRecord
from learner.lease_gate import LeaseGate
from learner.lease_rules import lease_timeout_s
from learner.pipelines import PipelineManager
from swarm.proto.stage import StageAssignment
from swarm.proto.work import Lease, PromptGroup, Sampling, WorkReply, WorkRequest


@dataclass
class SamplingDefaults:
    """The sampling settings every lease carries (the run's ``[train]`` values)."""

    temperature: float
    top_p: float
    max_tokens: int
    seed: int


class WorkDesk:
    def __init__(self, coordinator: Coordinator, pipelines: PipelineManager, gate: LeaseGate, changes: Changes, *,
                 sampling: SamplingDefaults, group_size: int, long_poll_s: float,
                 admission: Admission | None = None, episode: EpisodeSettings | None = None,
                 speed_of: Callable[[str], float] | None = None) -> None:
        self.coordinator = coordinator
        self.pipelines = pipelines
        self.gate = gate
        self.changes = changes
        self.sampling = sampling
        self.group_size = group_size
        self.long_poll_s = long_poll_s
        self.admission = admission
        self.episode = episode
        #: The tokens/s a peer announced (its leases last as long as that speed needs:
        #: ``lease_rules.lease_timeout_s``); None: every lease lasts ``lease_timeout_s``.
        self.speed_of = speed_of
        #: The run is over: every long poll answers ``done``.
        self.done = False
        #: Peers that have been told the run is over.
        self.told_done: set[str] = set()

    def finish(self) -> None:
        self.done = True
        self.changes.notify()

    # -- whole-model nodes -------------------------------------------------------------------
    async def node_work(self, msg: WorkRequest, peer_id: str,
                        first: Callable[[], WorkReply | None] | None = None) -> WorkReply:
        """A lease, or ``first()`` before it when that has a reply (a validation job)."""
        if self.gate.arrive(peer_id):
            self.changes.notify()  # the other waiters re-count
        return await self.long_poll(peer_id, lambda: (first and first()) or self.lease_reply(peer_id, msg.max_groups))

    # -- stage nodes -------------------------------------------------------------------------
    async def stage_work(self, msg: WorkRequest, peer_id: str) -> WorkReply:
        """An assignment when the stage node should load other layers or another adapter
        version; a lease when it heads a pipeline whose stages all hold the current version;
        else wait."""
        mgr, coord = self.pipelines, self.coordinator
        now = trio.current_time()
        mgr.report(peer_id, msg, now)
        mgr.sweep(now, busy=coord.ledger.busy_peers(now, mgr.settings.stale_s) | {peer_id})
        self.changes.notify()  # a head waiting on this stage's version re-checks its gate

        def attempt() -> WorkReply | None:
            version = coord.version
            update = mgr.update_for(peer_id, version)
            if update is not None:
                return WorkReply(retry_after_s=0.0, reason="stage_assignment", stage=update)
            if self.episode is not None or not mgr.may_lease(peer_id, version):  # heads run single-turn groups
                return None
            if self.gate.arrive(peer_id):
                self.changes.notify()
            return self.lease_reply(peer_id, msg.max_groups, limit=mgr.lease_cap(peer_id),
                                    stage=lambda record: mgr.assignment(peer_id, record.version))

        return await self.long_poll(peer_id, attempt)

    # -- the long poll and the lease -----------------------------------------------------------
    async def long_poll(self, peer_id: str, attempt: Callable[[], WorkReply | None]) -> WorkReply:
        """``attempt()`` (a reply, or None to wait for the next change) until the run is done or
        ``long_poll_s`` passes; ``peer_id`` leaves the waiters after."""
        try:
            with trio.move_on_after(self.long_poll_s):
                while True:
                    if self.done:
                        self.told_done.add(peer_id)
                        self.changes.notify()
                        return WorkReply(done=True, reason="done")
                    reply = attempt()
                    if reply is not None:
                        return reply
                    await self.changes.wait()
        finally:
            self.gate.leave(peer_id)
        return WorkReply(retry_after_s=0.0, reason="no_work")

    def lease_reply(self, peer_id: str, max_groups: int, limit: int | None = None,
                    stage: Callable[[LeaseRecord], StageAssignment] | None = None) -> WorkReply | None:
        """A lease for ``peer_id`` (admission caps and the gate permitting), with
        ``stage(record)`` attached for a pipeline head; None when there is nothing to lease."""
        coord = self.coordinator
        capped = self.admission and self.admission.lease_refusal(peer_id, coord.ledger.leases_held(peer_id))
        if capped:
            return WorkReply(retry_after_s=self.long_poll_s, reason=capped)
        closed, opened_now = self.gate.closed(coord.version, trio.current_time())
        if opened_now:
            self.changes.notify()
        if closed:
            return None
        timeout = None
        if self.speed_of is not None:
            speed = self.speed_of(peer_id)
            per_group = self.group_size * self.sampling.max_tokens
            timeout = lambda n: lease_timeout_s(coord.lease_timeout_s, n * per_group, speed)  # noqa: E731
        record = coord.lease(peer_id, max_groups, trio.current_time(), limit=limit, timeout_s=timeout)
        if record is None:
            return None
        self.changes.notify()
        return WorkReply(lease=self.lease_message(record), stage=stage(record) if stage else None)

    def lease_message(self, record: LeaseRecord) -> Lease:
        s, ep, spec = self.sampling, self.episode, self.coordinator.spec
        groups = [PromptGroup(gid, spec(gid).prompt_ids, *(("train", int(spec(gid).problem_ref)) if ep else ()))
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
