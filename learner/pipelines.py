"""Pipelines of stage nodes inside a running swarm: who serves which layers, and when a head
may be leased work.

A thin stateful wrapper around the pure allocator (:mod:`swarm.pipeline.allocate`): it keeps
a snapshot of the nodes, re-plans on join and leave (:func:`~swarm.pipeline.allocate.replan`,
with its rule against thrashing), names each pipeline, and answers the service's two
questions about a stage node that polls for work:

- :meth:`PipelineManager.update_for`: does the node need a new :class:`StageAssignment`
  (another range or pipeline, or a newer adapter version)?
- :meth:`PipelineManager.may_lease`: is the node the head of a pipeline whose every stage
  holds its assigned range for this pipeline at the lease's version (:func:`pipeline_ready`,
  the pure gate)?

Whole-model nodes (llama.cpp, or torch/MLX nodes that hold the model) are listed as one-stage
pipelines for the report (:meth:`PipelineManager.summary`); they keep being served by the ordinary
work path and never cause a re-plan: only stage nodes are planned, so a hello from a whole-model
node costs O(1) however many nodes joined before it (the planner re-planned over every node on
every hello before). The members are forgotten with the node roster's idle nodes
(:meth:`PipelineManager.leave`), and the plan history the report keeps is bounded.
Stage nodes the plan leaves over are made *replicas*: they load a copy of one hop's range
(the one the fewest copies cover that fits them) and are listed as that hop's spares, so a
head can replay a lost stage's inputs into them.

The stage protocol's requests (a stage's direct adapter fetch, a head's failover report, the
learner's probe of a stage reported lost) are in :mod:`learner.stage_requests`; a stage node's
long poll is :meth:`learner.work_desk.WorkDesk.stage_work`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from learner.config_net import PipelineConfig
from swarm.pipeline.allocate import (ModelSpec, NodeSpec, Pipeline, Plan, RunSpec, Stage, build_pipeline,
                                     end_costs, form_pipelines, layer_capacity, replan)
from swarm.discovery.links import Links
from swarm.pipeline.depth import in_flight_cap
from swarm.proto.stage import RouteHop, StageAssignment
from swarm.proto.work import WorkRequest

log = logging.getLogger("echo_swarm.learner")

#: Hello ``extra`` keys of a stage-capable node.
STAGE_KEY, STAGE_MODEL_KEY = "stage", "stage_model"
#: Bounds of a reported model geometry (decoder layers; bytes of any one tensor group).
MAX_LAYERS, MAX_BYTES = 4096, 1 << 40
#: Plans kept for the run's report (``swarm.json``'s ``pipeline_plans``), newest last.
HISTORY_KEPT = 50


@dataclass
class Member:
    """A node as the planner sees it, and what it last said it holds."""

    peer_id: str
    spec: NodeSpec
    addrs: list[str]
    #: Stage-capable (polls for assignments); False for whole-model nodes.
    stage: bool
    last_seen: float
    held_pipeline: str = ""
    held_range: tuple[int, int] = (-1, -1)
    held_version: int = -1


@dataclass(frozen=True)
class Candidate:
    """What the planner needs of a node's hello."""

    memory_bytes: int
    tokens_per_s: float
    addrs: tuple[str, ...]
    #: The stage geometry of a stage node's hello (None: a whole-model node).
    model: ModelSpec | None

    @classmethod
    def from_hello(cls, hello: Any) -> Candidate:
        """From a :class:`~swarm.proto.hello.Hello`; ``ValueError`` for a bad stage geometry."""
        return cls(int(hello.memory_bytes), float(hello.tokens_per_s), tuple(hello.addrs),
                   parse_stage_hello(hello.extra))


def parse_stage_hello(extra: Mapping[str, str]) -> ModelSpec | None:
    """The model geometry of a stage-capable hello, or None for a whole-model node. Raises
    ``ValueError`` on a stage hello whose geometry does not parse."""
    if extra.get(STAGE_KEY) != "1":
        return None
    try:
        raw = json.loads(extra.get(STAGE_MODEL_KEY, ""))
        names = {f.name for f in dataclasses.fields(ModelSpec)}
        if not isinstance(raw, dict) or set(raw) - names:
            raise ValueError(f"unexpected fields {sorted(set(raw) - names) if isinstance(raw, dict) else raw}")
        fields: dict[str, Any] = {k: (float(v) if k == "head_compute_layers" else int(v)) for k, v in raw.items()}
        spec = ModelSpec(**fields)
    except (TypeError, ValueError, OverflowError) as e:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"bad stage model geometry: {e}") from e
    sizes = (spec.layer_bytes, spec.embed_bytes, spec.head_bytes, spec.kv_bytes_per_token)
    if spec.n_layers > MAX_LAYERS or max(sizes) > MAX_BYTES or not spec.head_compute_layers <= MAX_LAYERS:
        raise ValueError(f"bad stage model geometry: out of range ({spec})")
    return spec


def pipeline_ready(stages: Sequence[Stage], pipeline_id: str, held: Mapping[str, tuple[str, int, int, int]],
                   version: int) -> bool:
    """The lease gate: True when every stage of the pipeline holds (pipeline id, its layer range,
    ``version``). ``held`` maps a peer to ``(pipeline_id, start, end, adapter_version)``."""
    if not stages:
        return False
    for s in stages:
        if held.get(s.node_id) != (pipeline_id, s.start, s.end, version):
            return False
    return True


def assign_replicas(plan: Plan, caps: Mapping[str, int], e_first: int, e_last: int) -> dict[str, tuple[str, Stage]]:
    """Spare node -> (pipeline key, the hop it copies): each spare (most capacity first) copies
    the hop with the fewest copies so far that fits in its capacity (the end cost counts on the
    last hop). The first hop is never copied: the head drives the generation, and a head that
    dies loses its lease anyway. Pure; hops are keyed by ``"pipeline index:hop index"``."""
    copies: dict[str, int] = {}
    hops: list[tuple[str, Stage, int]] = []
    for pi, p in enumerate(plan.pipelines):
        if len(p.stages) < 2:
            continue
        n = len(p.stages)
        for hi, s in enumerate(p.stages):
            if hi == 0:
                continue
            need = s.n_layers + (e_last if hi == n - 1 else 0)
            hops.append((f"{pi}:{hi}", s, need))
            copies[f"{pi}:{hi}"] = 0
    out: dict[str, tuple[str, Stage]] = {}
    for peer in sorted(plan.spare, key=lambda p: (-caps.get(p, 0), p)):
        fits = [(copies[k], k, s) for k, s, need in hops if caps.get(peer, 0) >= need]
        if not fits:
            continue
        _, key, stage = min(fits, key=lambda t: (t[0], t[1]))
        copies[key] += 1
        out[peer] = (key, stage)
    return out


class PipelineManager:
    def __init__(self, group_size: int, max_tokens: int, settings: PipelineConfig,
                 on_plan: Callable[[], None] | None = None,
                 links: Callable[[list[str]], Links | None] | None = None,
                 rtt: Callable[[str], float | None] | None = None):
        self.settings = settings
        #: The learner's measured round trip to a node (``SwarmHost.rtt``; None: unknown). The
        #: allocator's ``rtt(a, b)`` is estimated as the sum of the two (a path through the
        #: learner's neighbourhood), so a pipeline is headed by its member nearest the others.
        self.rtt = rtt
        #: The learner's current links given the members (``swarm.discovery.links``; a member whose
        #: reachability is not measured yet counts as dialable; None: every pair can link): a
        #: pipeline's head must link with each of its stages, and a stage the head cannot dial is
        #: told to dial the head (``StageAssignment.dial``).
        self.links = links
        self.run = RunSpec(group_size=group_size, max_tokens=max_tokens + self.settings.prompt_tokens,
                           in_flight=self.settings.in_flight)
        self.model: ModelSpec | None = None
        #: Stage nodes (the ones planned).
        self.members: dict[str, Member] = {}
        #: Whole-model nodes (listed in the report as one-stage pipelines, never planned).
        self._whole: dict[str, Member] = {}
        self.plan: Plan | None = None
        #: Pipeline key (its stages) -> id, stable while the pipeline is unchanged.
        self._ids: dict[tuple[Stage, ...], str] = {}
        self._next = 0
        #: peer -> (pipeline id, hop index) of the replica it serves.
        self.replicas: dict[str, tuple[str, Stage]] = {}
        #: The last :data:`HISTORY_KEPT` plans, for the run's report: time, why, the stage
        #: pipelines, spares and replicas, and how many whole-model nodes were listed beside them.
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_KEPT)
        #: Called after every re-plan (the service: per-range manifests, wake the long polls).
        self.on_plan = on_plan

    # -- membership --------------------------------------------------------------------------
    def has_stages(self) -> bool:
        return bool(self.members)

    def is_stage(self, peer_id: str) -> bool:
        return peer_id in self.members

    def join(self, peer_id: str, hello: Any, now: float) -> None:
        """:meth:`enter` from a hello; ``ValueError`` for a bad stage geometry."""
        self.enter(peer_id, Candidate.from_hello(hello), now)

    def enter(self, peer_id: str, node: Candidate, now: float) -> None:
        """Add (or refresh) a node; raises ``ValueError`` for a stage node whose model geometry
        differs from the other stage nodes'. Only a stage node's entry (or a stage node coming
        back as a whole-model one) re-plans."""
        model = node.model
        if model is not None:
            if self.model is not None and model != self.model:
                raise ValueError(f"stage geometry {model} differs from the run's {self.model}")
            self.model = model
        spec = NodeSpec(peer_id, node.memory_bytes, max(node.tokens_per_s, 1e-3), whole_only=model is None)
        member = Member(peer_id, spec, list(node.addrs), model is not None, now)
        if member.stage:
            self._whole.pop(peer_id, None)
            self.members[peer_id] = member
            self._replan(now, f"join {peer_id[-6:]}")
        else:
            self._whole[peer_id] = member
            if self.members.pop(peer_id, None) is not None:
                self._replan(now, f"join {peer_id[-6:]} (whole model)")

    def leave(self, peer_id: str, now: float, why: str = "left") -> bool:
        if self._whole.pop(peer_id, None) is not None:
            return True
        if self.members.pop(peer_id, None) is None:
            return False
        self._replan(now, f"{why} {peer_id[-6:]}")
        return True

    def sweep(self, now: float, busy: set[str]) -> list[str]:
        """Stage nodes silent for ``stale_s`` (and holding no lease) leave the plan."""
        gone = [p for p, m in self.members.items()
                if p not in busy and now - m.last_seen > self.settings.stale_s]
        for p in gone:
            self.leave(p, now, "silent")
        return gone

    def report(self, peer_id: str, req: WorkRequest, now: float) -> None:
        m = self.members[peer_id]
        m.last_seen = now
        m.held_pipeline = req.pipeline_id
        m.held_range = (req.layer_start, req.layer_end)
        m.held_version = req.have_version

    # -- planning ----------------------------------------------------------------------------
    def _replan(self, now: float, why: str) -> None:
        if self.model is None:
            return
        nodes = [m.spec for m in self.members.values()]
        cfg = self.settings
        links = self.links(list(self.members)) if self.links is not None else None
        can_link = links.can_link if links is not None else None
        rtt = None
        if self.rtt is not None:
            to_learner = {p: self.rtt(p) or 0.0 for p in self.members}
            rtt = lambda a, b: to_learner.get(a, 0.0) + to_learner.get(b, 0.0)  # noqa: E731
        if self.plan is None:
            self.plan = form_pipelines(nodes, self.model, self.run, cfg, now, can_link, rtt)
        else:
            self.plan = replan(self.plan, nodes, self.model, self.run, cfg, now, can_link, rtt)
        self._ids = {p.stages: self._ids[p.stages] for p in self.plan.pipelines if p.stages in self._ids}
        for p in self.plan.pipelines:
            if p.stages not in self._ids:
                self._ids[p.stages] = f"p{self._next}"
                self._next += 1
        caps = {m.peer_id: layer_capacity(m.spec, self.model, self.run, cfg)
                for m in self.members.values() if m.stage}
        spare_stage = dataclasses.replace(self.plan, spare=tuple(p for p in self.plan.spare if p in caps))
        raw = assign_replicas(spare_stage, caps, *end_costs(self.model, self.run))
        self.replicas = {peer: (self._ids[self.plan.pipelines[int(key.split(":")[0])].stages], st)
                         for peer, (key, st) in raw.items()}
        summary = self.summary(whole=False)
        self.history.append({"t": round(now, 3), "why": why, **summary, "whole_nodes": len(self._whole)})
        log.info("pipelines re-planned (%s): %s", why, summary["pipelines"])
        if self.on_plan is not None:
            self.on_plan()

    def pipeline_peers(self, peer_id: str) -> set[str]:
        """The stage nodes of ``peer_id``'s pipeline (its hops and the replicas of its hops)."""
        mine = self.pipeline_of(peer_id)
        if mine is None:
            return set()
        pid, stages = mine
        return {s.node_id for s in stages} | {p for p, (rp, _) in self.replicas.items() if rp == pid}

    def pipeline_of(self, peer_id: str) -> tuple[str, tuple[Stage, ...]] | None:
        if self.plan is None:
            return None
        for p in self.plan.pipelines:
            if peer_id in p.node_ids:
                return self._ids[p.stages], p.stages
        whole = self._whole_pipeline(peer_id)
        return (whole_id(peer_id), whole.stages) if whole is not None else None

    def _whole_pipeline(self, peer_id: str) -> Pipeline | None:
        """A whole-model node's one-stage pipeline (None: not one, or it cannot hold the model)."""
        m = self._whole.get(peer_id)
        if m is None or self.model is None:
            return None
        return build_pipeline([m.spec], self.model, self.run, self.settings)

    def _hop(self, peer: str, s: Stage) -> RouteHop:
        m = self.members.get(peer)
        return RouteHop(peer, s.start, s.end, list(m.addrs) if m else [])

    def assignment(self, peer_id: str, version: int) -> StageAssignment:
        """The node's place in the current plan (an empty assignment: no layers)."""
        n_layers = self.model.n_layers if self.model else 0
        where = self.pipeline_of(peer_id)
        if where is None and peer_id in self.replicas:
            pid, st = self.replicas[peer_id]
            stages = next((k for k, v in self._ids.items() if v == pid), ())
            return StageAssignment(pipeline_id=pid, start=st.start, end=st.end, n_layers=n_layers,
                                   route=[self._hop(s.node_id, s) for s in stages], version=version, in_flight=1,
                                   dial=self.dials_of(peer_id, stages))
        if where is None:
            return StageAssignment(n_layers=n_layers, version=version)
        pid, stages = where
        mine = next(s for s in stages if s.node_id == peer_id)
        spares = [self._hop(peer, st) for peer, (p, st) in sorted(self.replicas.items())
                  if p == pid and self._holds(peer, pid, st, version)]
        return StageAssignment(pipeline_id=pid, start=mine.start, end=mine.end, n_layers=n_layers,
                               route=[self._hop(s.node_id, s) for s in stages], spares=spares, version=version,
                               in_flight=self.lease_cap(peer_id), head=stages[0].node_id == peer_id,
                               dial=self.dials_of(peer_id, stages))

    def lease_cap(self, peer_id: str) -> int:
        """Most groups ``peer_id``'s pipeline may keep in flight (its head asks for what its links'
        round trips need, up to this): its stages' spare memory, at least ``in_flight``."""
        where = self.pipeline_of(peer_id)
        s = self.settings
        if where is None or self.model is None:
            return s.in_flight
        m, run, cfg = self.model, self.run, s
        mems = [self.members[st.node_id].spec.memory_bytes * cfg.usable_fraction - cfg.reserve_bytes
                if st.node_id in self.members else 0.0 for st in where[1]]
        return in_flight_cap([(st.start, st.end) for st in where[1]], m.n_layers, mems, m.layer_bytes,
                             m.kv_bytes_per_token * run.group_size * run.max_tokens, (m.embed_bytes, m.head_bytes),
                             s.in_flight, max(s.in_flight, s.max_in_flight))

    def dials_of(self, peer_id: str, stages: Sequence[Stage]) -> list[str]:
        """The peers ``peer_id`` must dial for its pipeline (connection reversal): the head when the
        head cannot dial it (the head opens every stage's streams over that connection)."""
        links = self.links(list(self.members)) if self.links is not None else None
        if links is None or not stages or stages[0].node_id == peer_id:
            return []
        d = links.dial(stages[0].node_id, peer_id)
        return [d.listener] if d is not None and d.needs_instruction and d.dialer == peer_id else []

    def _holds(self, peer: str, pid: str, st: Stage, version: int) -> bool:
        m = self.members.get(peer)
        return m is not None and (m.held_pipeline, *m.held_range, m.held_version) == (pid, st.start, st.end, version)

    def update_for(self, peer_id: str, version: int) -> StageAssignment | None:
        """The assignment to send ``peer_id``, or None when it holds what it should."""
        m = self.members.get(peer_id)
        if m is None or not m.stage:
            return None
        a = self.assignment(peer_id, version)
        want = (a.pipeline_id, a.start, a.end) if a.pipeline_id else ("", -1, -1)
        if (m.held_pipeline, *m.held_range) != want:
            return a
        if a.pipeline_id and m.held_version != version:
            return a
        return None

    def held(self) -> dict[str, tuple[str, int, int, int]]:
        return {p: (m.held_pipeline, *m.held_range, m.held_version) for p, m in self.members.items()}

    def may_lease(self, peer_id: str, version: int) -> bool:
        """True when ``peer_id`` heads a multi-node or stage pipeline that holds ``version`` throughout."""
        where = self.pipeline_of(peer_id)
        if where is None or not self.is_stage(peer_id):
            return False
        pid, stages = where
        return stages[0].node_id == peer_id and pipeline_ready(stages, pid, self.held(), version)

    def ranges(self) -> list[tuple[int, int]]:
        """Layer ranges served by stage nodes (for per-range adapter manifests)."""
        out = {(s.start, s.end) for p in (self.plan.pipelines if self.plan else ())
               for s in p.stages if self.is_stage(s.node_id)}
        return sorted(out)

    def roles(self) -> dict[str, str]:
        """Peer -> its place, in a few words (the dashboard's stage column): ``p0 [0,10) head``,
        ``p0 [10,20)``, ``replica of p0 [10,20)``, ``spare``, or ``whole model``."""
        out = {peer: "whole model" for peer in self._whole}
        for p in self.plan.pipelines if self.plan is not None else ():
            pid = self._ids[p.stages]
            for i, st in enumerate(p.stages):
                if st.node_id in self.members:
                    out[st.node_id] = f"{pid} [{st.start},{st.end})" + (" head" if i == 0 and len(p.stages) > 1 else "")
        for peer, (pid, st) in self.replicas.items():
            out[peer] = f"replica of {pid} [{st.start},{st.end})"
        for peer in self.members:
            out.setdefault(peer, "spare")
        return out

    def summary(self, whole: bool = True) -> dict[str, Any]:
        """The plan for the report: pipelines (the stage nodes', then with ``whole`` the
        whole-model nodes' one-stage pipelines, by peer id), spare nodes, replicas."""
        if self.plan is None:
            return {"pipelines": [], "spare": []}
        listed = [(self._ids[p.stages], p) for p in self.plan.pipelines]
        spare = list(self.plan.spare)
        for peer in sorted(self._whole) if whole else ():
            one = self._whole_pipeline(peer)
            if one is None:
                spare.append(peer)
            else:
                listed.append((whole_id(peer), one))
        return {
            "pipelines": [{"id": pid, "tokens_per_s": round(p.tokens_per_s, 2),
                           "stages": [[s.node_id, s.start, s.end] for s in p.stages]} for pid, p in listed],
            "spare": sorted(spare),
            "replicas": {peer: [pid, st.start, st.end] for peer, (pid, st) in self.replicas.items()},
            "method": self.plan.method,
        }


def whole_id(peer_id: str) -> str:
    """The id of a whole-model node's one-stage pipeline in the report."""
    return f"w{peer_id[-6:]}"
