"""The stage protocol's requests at the learner, over the pipeline plan
(:class:`~learner.pipelines.PipelineManager`): a stage's direct fetch of its slice of an adapter
(:func:`stage_adapter`), a pipeline head's failover report (:func:`stage_report`), the learner's
own probe of a stage reported lost (:func:`stage_alive`), and the console line of a plan
(:func:`describe_pipelines`)."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import trio

from learner.coordinator import Coordinator
from learner.pipelines import PipelineManager
from swarm.chunks.streams import close_stream
from swarm.errors import SwarmError
from swarm.pipeline.layers import slice_for_range
from swarm.pipeline.proto import PIPELINE
from swarm.proto.adapter import AdapterReply
from swarm.proto.stage import StageAdapterRequest, StageReport, StageReportAck

if TYPE_CHECKING:
    from swarm.host import SwarmHost

log = logging.getLogger("echo_swarm.learner")


def stage_adapter(reply: AdapterReply, msg: StageAdapterRequest) -> AdapterReply:
    """The tensors of published ``reply`` for layers ``[layer_start, layer_end)`` (a stage's
    direct fetch); ``ValueError`` for an empty range. ``reply`` itself is not changed."""
    if msg.layer_end <= msg.layer_start:
        raise ValueError(f"empty layer range [{msg.layer_start}, {msg.layer_end})")
    return dataclasses.replace(reply, tensors=slice_for_range(reply.tensors, msg.layer_start, msg.layer_end))


def stage_report(pipelines: PipelineManager, coord: Coordinator, msg: StageReport, peer_id: str
                 ) -> tuple[StageReportAck, list[str]]:
    """A head's failover report: replayed groups are noted in the ledger; failed ones go back
    to pending at once. Returns the ack and the peers it says were lost that serve the head's
    own pipeline (its hops and their replicas): only those are evidence, and only once the
    learner's own probe confirms them (:func:`stage_alive`) do they leave the plan. A report
    naming any other stage changes nothing."""
    coord.record_replayed(peer_id, msg.lease_id, msg.replayed)
    requeued = coord.release_groups(peer_id, msg.lease_id, msg.failed, "stage_lost: re-leased")
    mine = pipelines.pipeline_peers(peer_id)
    lost = [p for p in dict.fromkeys(msg.lost_peers) if p != peer_id and p in mine]
    ignored = [p[-6:] for p in msg.lost_peers if p not in lost]
    log.warning("pipeline head %s: %d group(s) replayed, %d re-leased (%s); lost %s%s", peer_id[-6:],
                len(msg.replayed), len(requeued), msg.reason[:200], [p[-6:] for p in lost],
                f"; not of its pipeline, ignored: {ignored}" if ignored else "")
    return StageReportAck(requeued=requeued), lost


#: The longest the learner's probe of a stage reported lost may take (s); longer on a slow link:
#: ``STAGE_PROBE_ROUND_TRIPS`` of the stage's measured round trips (``swarm.rtt.scaled``).
STAGE_PROBE_TIMEOUT_S = 5.0
STAGE_PROBE_ROUND_TRIPS = 4


async def stage_alive(host: SwarmHost, peer_id: str, timeout_s: float = STAGE_PROBE_TIMEOUT_S) -> bool:
    """The learner's own probe of a stage node a head reported lost: can a fresh stream on the
    stage protocol be opened to it within ``timeout_s`` (more on a slow link)?"""
    from swarm.rtt import scaled

    timeout_s = scaled(timeout_s, host.rtt(peer_id), STAGE_PROBE_ROUND_TRIPS)
    try:
        stream = await host.open_stream(peer_id, PIPELINE, timeout=timeout_s)
    except (SwarmError, OSError, trio.TooSlowError):
        return False
    await close_stream(stream, reset=True)
    return True


def describe_pipelines(summary: dict, backends: dict[str, str], whole_nodes: int = 0) -> str:
    """One line per plan: ``p0 = [0,10) ab12cd > [10,20) ... ; p1 = llamacpp ef34gh (whole)``;
    ``whole_nodes``: whole-model nodes left out of ``summary``, counted at the end."""
    parts = []
    for p in summary.get("pipelines", []):
        if len(p["stages"]) == 1:
            peer = p["stages"][0][0]
            parts.append(f"{p['id']} = {backends.get(peer, '?')} {peer[-6:]} (whole model)")
        else:
            hops = " > ".join(f"[{s},{e}) {peer[-6:]}" for peer, s, e in p["stages"])
            parts.append(f"{p['id']} = {hops} (~{p['tokens_per_s']:.0f} tok/s)")
    if summary.get("spare"):
        parts.append("spare " + ", ".join(p[-6:] for p in summary["spare"]))
    if whole_nodes:
        parts.append(f"and {whole_nodes} whole-model node(s)")
    return "; ".join(parts) or "none yet"
