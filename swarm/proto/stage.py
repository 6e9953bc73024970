"""Pipeline membership: the learner tells a stage node its place; the head reports failovers.

A *stage node* (``swarm-node join --max-memory SIZE`` too small for the whole model, or
``--stage``) says so in its hello (``extra["stage"] = "1"`` and the model geometry as
``extra["stage_model"]``, a JSON object of :class:`swarm.pipeline.allocate.ModelSpec`
fields). It then long-polls ``work`` like any node; its :class:`~swarm.proto.work.WorkRequest`
carries the layer range it holds and its adapter version, and the learner's
:class:`~swarm.proto.work.WorkReply` carries, when anything changed, a
:class:`StageAssignment` (which pipeline, which layers, the ordered route, spares and the
adapter version to hold). Only the head (first stage) of a pipeline is ever leased work.

Two request/response families beside ``work``:

- ``stage-adapter``: :class:`StageAdapterRequest` -> :class:`~swarm.proto.adapter.AdapterReply`
  holding only the tensors of layers ``[layer_start, layer_end)``: the direct-fetch path of a
  stage's adapter slice.
- ``stage-report``: :class:`StageReport` -> :class:`StageReportAck`: the head tells the learner
  which groups of a lease were replayed into a spare after a stage died, and which could not
  be finished (they go back to pending at once) and which stage peers were lost.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.proto import protocol_id
from swarm.wire import Message, bounded, bounded_default

STAGE_ADAPTER = protocol_id("stage-adapter")
STAGE_REPORT = protocol_id("stage-report")


@dataclass
class RouteHop(Message):
    KIND = "route_hop"
    peer_id: str = bounded(max_items=200)
    #: Layers ``[start, end)`` that this hop serves.
    start: int = bounded(min=0)
    end: int = bounded(min=1)
    #: Multiaddrs to dial it (each ending in ``/p2p/<peer id>``).
    addrs: list[str] = bounded(max_items=16, max_len=512)


@dataclass
class StageAssignment(Message):
    KIND = "stage_assignment"
    #: Learner-unique id of the pipeline (changes whenever the pipeline is re-formed); ``""``:
    #: the node is in no pipeline now (spare, or unplanned) and serves no layers.
    pipeline_id: str = bounded_default("", max_items=256)
    #: This node's layers ``[start, end)`` (0, 0 when it serves none).
    start: int = bounded_default(0, min=0)
    end: int = bounded_default(0, min=0)
    #: Decoder layers of the whole model.
    n_layers: int = bounded_default(0, min=0)
    #: The ordered stages of the pipeline, first (head) to last; this node is one of them.
    route: list[RouteHop] = bounded_default([], max_items=1024)
    #: Nodes that serve a copy of some hop's range (replacements the head may replay into).
    spares: list[RouteHop] = bounded_default([], max_items=1024)
    #: Adapter version the node should hold (the learner's current one).
    version: int = bounded_default(0, min=0)
    #: Groups the head may keep in flight at once (its lease size).
    in_flight: int = bounded_default(1, min=1, max=1024)
    #: True for the pipeline's head (first stage), which is leased the pipeline's work; a
    #: replica (a spare copy of one hop, not in ``route``) and the other stages only serve.
    head: bool = False
    #: Peers (of ``route``) this node must dial itself because they cannot dial it: connection
    #: reversal (``swarm.discovery.links``); the head then opens its streams over that connection.
    dial: list[str] = bounded_default([], max_items=64, max_len=128)


@dataclass
class StageAdapterRequest(Message):
    KIND = "stage_adapter_request"
    #: Wanted version; -1 means "the current one".
    version: int = bounded(min=-1)
    #: The layer range whose adapter tensors are wanted.
    layer_start: int = bounded(min=0)
    layer_end: int = bounded(min=1)


@dataclass
class StageReport(Message):
    KIND = "stage_report"
    lease_id: str = bounded(max_items=200)
    #: Groups that finished after replaying a lost stage's inputs into a spare.
    replayed: list[str] = bounded(max_items=1024, max_len=256)
    #: Groups the head could not finish (a stage lost, no spare): back to pending now.
    failed: list[str] = bounded(max_items=1024, max_len=256)
    #: Stage peers the head lost during the lease.
    lost_peers: list[str] = bounded(max_items=64, max_len=128)
    #: The head's reason, for the learner's log.
    reason: str = ""


@dataclass
class StageReportAck(Message):
    KIND = "stage_report_ack"
    #: Groups put back to pending by this report.
    requeued: list[str] = bounded_default([], max_items=1024, max_len=256)
