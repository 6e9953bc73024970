"""A stage node: serves the layer range the learner assigns, and heads its pipeline's leases.

``swarm-node join --backend torch --max-memory 300MB`` on a machine whose cap is too small for
the whole model (or ``--stage``) runs this agent instead of loading the model. It joins with a
stage-capable hello (``extra["stage"] = "1"``, the model geometry, ``memory_bytes`` = the cap,
an estimated speed) and long-polls ``work`` like any node, telling the learner the layers
and adapter version it holds. The learner answers with a
:class:`~swarm.proto.stage.StageAssignment` whenever that should change: the node then loads
only that range (:class:`~node_agents.stages.torch_stage.TorchStage` or ``MlxStage``), serves
``/echo-swarm/pipeline/1.0.0`` on its libp2p host, installs its layers' slice of the
assigned adapter version (per-range push manifests when the dissemination client offers
them, else the direct ``stage-adapter`` fetch) and polls again. An adapter or range switch
waits (bounded) for the sessions in flight to end.

The head (first stage) is leased work only when every stage of its pipeline holds the lease's
version. It drives each group through the route with
:func:`~node_agents.stages.head.generate_over_route` (its own stage through a local link,
the lease's groups concurrently), replays a lost stage into a spare of the same range when
the assignment lists one, reports replays and unfinished groups to the learner
(``stage-report``: those go back to pending at once) and pushes the rollouts as any node.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

import trio

from node_agents.adapter_sync import AdapterSync
from node_agents.discovery import NodeDiscovery
from node_agents.agent import LONG_POLL_GRACE_S, LearnerGone, NodeAgent
from node_agents.backends.base import Capabilities, SamplingParams
from swarm.errors import SwarmError
from swarm.pipeline.allocate import ModelSpec, model_spec_from_hf_config
from swarm.proto import WORK
from swarm.proto.adapter import AdapterReply
from swarm.proto.rollouts import Completion, GroupResult
from swarm.proto.stage import (STAGE_ADAPTER, STAGE_REPORT, StageAdapterRequest, StageAssignment, StageReport,
                               StageReportAck)
from swarm.proto.work import Lease, WorkReply, WorkRequest, group_seed
from swarm.wire import WireError

log = logging.getLogger("echo_swarm.node")

#: Fraction of the memory cap a whole model may fill before the node joins as a stage.
WHOLE_MODEL_FRACTION = 0.9
#: Longest wait (s) for a stage's open sessions to end before its adapter or range is swapped.
DRAIN_TIMEOUT_S = 60.0
#: Deadline (s) of one dial to a route peer the learner names (connection reversal).
DIAL_ROUTE_TIMEOUT_S = 8.0


def stage_geometry(model_dir: str | Path, dtype_bytes: int) -> ModelSpec:
    """The allocator's view of the HF model in ``model_dir`` at ``dtype_bytes`` per weight."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return model_spec_from_hf_config(config, dtype_bytes)


def whole_model_bytes(spec: ModelSpec) -> int:
    return spec.n_layers * spec.layer_bytes + spec.embed_bytes + spec.head_bytes


def wants_stage(max_memory_bytes: int, forced: bool, spec: ModelSpec) -> bool:
    """Join as a stage node: forced (``--stage``), or a cap too small for the whole model."""
    return forced or (max_memory_bytes > 0 and whole_model_bytes(spec) > WHOLE_MODEL_FRACTION * max_memory_bytes)


def estimate_tokens_per_s(spec: ModelSpec, dtype_bytes: int, seconds: float = 0.2) -> float:
    """Whole-model decode speed this machine would reach, estimated from a short matmul
    benchmark (2 flops per weight per token); a stage node never loads the whole model."""
    import numpy as np

    a = np.ones((512, 512), dtype=np.float32)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ a
        n += 1
    flops = n * 2 * 512**3 / (time.perf_counter() - t0)
    weights = whole_model_bytes(spec) / dtype_bytes
    return float(flops / (2 * weights))


class _StageCaps:
    """Stands in for a backend in :class:`NodeAgent`'s join: capabilities only."""

    def __init__(self, caps: Capabilities) -> None:
        self._caps = caps
        self.name = caps.backend

    def capabilities(self) -> Capabilities:
        return self._caps

    def close(self) -> None:
        pass


class _NoLayers:
    """The executor while the node serves no layers: every session is refused (wrong range)."""

    start = end = n_layers = 0
    adapter_version = -1

    def open_session(self, session_id, req):  # pragma: no cover - check_open refuses first
        raise ValueError("this node serves no layers")

    def forward(self, session_id, req):  # pragma: no cover
        raise ValueError("this node serves no layers")

    def close_session(self, session_id) -> None:
        pass


class StageAgent(NodeAgent):
    def __init__(self, cfg, model_dir: Path, spec: ModelSpec, caps: Capabilities, name: str = "stage",
                 net: NodeDiscovery | None = None, nat=None):
        super().__init__(cfg, _StageCaps(caps), name, net, nat)
        self.model_dir = Path(model_dir)
        self.spec = spec
        self.stage = None  # the executor of the assigned range
        self.server = None  # swarm.pipeline.server.StageServer on this host
        self.assignment: StageAssignment | None = None
        self.pipeline_id = ""
        self._eog: frozenset[int] | None = None
        #: Failovers seen as head: groups replayed into a spare, groups handed back.
        self.replayed = 0
        self.handed_back = 0
        #: As head: groups to ask for, from the last lease's measured compute and the links'
        #: round trips (``swarm.pipeline.depth``); 0 until measured (then the assignment's cap).
        self.depth = 0

    # -- joining: the push tree only when it can send per-range slices ----------------------
    async def _start_sync(self, host, peer: str) -> None:
        if hasattr(AdapterSync, "set_layer_range"):
            await super()._start_sync(host, peer)
            if self.stage is not None:
                self.sync.set_layer_range(self.stage.start, self.stage.end)
        else:
            self.sync = None

    # -- the long poll ---------------------------------------------------------------------
    def _request(self) -> WorkRequest:
        st = self.stage
        have = st.adapter_version if st is not None and self.adapter_key and self.adapter_key[0] == self.run_id else -1
        a = self.assignment
        if a is not None and a.head:
            groups = min(a.in_flight, self.depth) if self.depth else a.in_flight
            groups = max(self.cfg.max_groups, groups)
        else:
            groups = max(self.cfg.max_groups, 1)
        return WorkRequest(have_version=have, max_groups=groups,
                           layer_start=st.start if st is not None else -1, layer_end=st.end if st is not None else -1,
                           pipeline_id=self.pipeline_id if st is not None else "")

    async def _work_loop(self, host, peer: str) -> bool:
        while True:
            reply = await host.request(peer, WORK, self._request(), WorkReply,
                                       timeout=self.cfg.request_timeout_s + LONG_POLL_GRACE_S)
            if reply.done:
                return True
            if reply.stage is not None:
                await self._apply(host, peer, reply.stage)
            if reply.lease is not None:
                await self._serve_lease(host, peer, reply.lease)
            elif reply.stage is None:
                await trio.sleep(reply.retry_after_s)

    async def _drain(self) -> None:
        sessions = self.stage.sessions if self.stage is not None else ()
        with trio.move_on_after(DRAIN_TIMEOUT_S):
            while len(sessions):
                await trio.sleep(0.05)

    async def _apply(self, host, peer: str, a: StageAssignment) -> None:
        """Load the assigned range (if it changed) and its adapter slice at ``a.version``."""
        from swarm.pipeline.server import serve_stage

        self.assignment = a
        if not a.pipeline_id or a.end <= a.start:
            if self.stage is not None:
                await self._drain()
                self.say(f"no layers assigned now (was [{self.stage.start}, {self.stage.end}))")
            self.stage, self.pipeline_id, self.adapter_key = None, "", None
            if self.server is not None:
                self.server.executor = _NoLayers()
            return
        if self.stage is None or (self.stage.start, self.stage.end) != (a.start, a.end):
            if self.stage is not None:
                await self._drain()
            t0 = time.perf_counter()
            stage = await trio.to_thread.run_sync(self._load, a.start, a.end)
            self.stage, self.adapter_key = stage, None
            if self.server is None:
                self.server = serve_stage(host, stage)
            else:
                self.server.executor = stage
            if self.sync is not None:
                self.sync.set_layer_range(a.start, a.end)
            self.say(f"pipeline {a.pipeline_id}: serving layers [{a.start}, {a.end}) of {a.n_layers} "
                     f"({stage.weight_bytes / 1e6:.0f} MB, loaded in {time.perf_counter() - t0:.1f}s), "
                     f"route {[(h.peer_id[-6:], h.start, h.end) for h in a.route]}")
        self.pipeline_id = a.pipeline_id
        await self._dial_route(host, a)
        if self.adapter_key != (self.run_id, a.version):
            await self._install_adapter(host, peer, a.version)

    async def _dial_route(self, host, a: StageAssignment) -> None:
        """Connection reversal: dial the route's peers the learner names (the head cannot dial this
        node; it opens its stage streams over this connection). A failure is logged, not fatal:
        the head then reports the stage lost as it would any unreachable stage."""
        for hop in [h for h in a.route if h.peer_id in set(a.dial)]:
            err = "no address"
            for addr in hop.addrs[:8]:
                try:
                    with trio.fail_after(DIAL_ROUTE_TIMEOUT_S):
                        await host.connect(addr)
                    err = ""
                    break
                except (SwarmError, trio.TooSlowError) as e:
                    err = f"{type(e).__name__}: {e}"
            if err:
                log.warning("pipeline %s: could not dial %s (the head cannot dial this node): %s",
                            a.pipeline_id, hop.peer_id[-6:], err)
            else:
                self.say(f"pipeline {a.pipeline_id}: dialled {hop.peer_id[-6:]} (connection reversal: it cannot "
                         f"dial this node)")

    def _load(self, start: int, end: int):
        cfg = self.cfg
        if cfg.backend == "mlx":
            from node_agents.stages.mlx_stage import MlxStage

            return MlxStage(self.model_dir, start, end)
        from node_agents.stages.torch_stage import TorchStage

        return TorchStage(self.model_dir, start, end, device=cfg.device or None, dtype=cfg.dtype or None,
                          threads=cfg.threads)

    async def _install_adapter(self, host, peer: str, version: int) -> None:
        t0 = time.perf_counter()
        st = self.stage
        adapter = await self.sync.adapter(version) if self.sync is not None else None
        how = "pushed"
        if adapter is None:
            how = "fetched"
            reply = await host.request(peer, STAGE_ADAPTER, StageAdapterRequest(version, st.start, st.end),
                                       AdapterReply, timeout=self.cfg.request_timeout_s)
            if reply.version != version:
                raise LearnerGone(f"asked for adapter v{version}, got v{reply.version}")
            adapter = reply.to_adapter()
        await self._drain()
        await trio.to_thread.run_sync(st.set_adapter, adapter)
        self.adapter_key = (self.run_id, version)
        log.info("stage [%d, %d): adapter v%d (%s, %d tensors) installed in %.2fs", st.start, st.end, version, how,
                 len(adapter.tensors), time.perf_counter() - t0)

    # -- heading a pipeline ----------------------------------------------------------------
    async def _dial(self, host, hops) -> None:
        for h in hops:
            if h.peer_id == host.peer_id:
                continue
            for addr in h.addrs:
                try:
                    await host.connect(addr)
                    break
                except (SwarmError, OSError, ValueError) as e:
                    log.info("cannot dial stage %s at %s: %s", h.peer_id[-6:], addr, e)

    async def _serve_lease(self, host, peer: str, lease: Lease) -> None:
        from node_agents.backends.eog import eog_token_ids
        from node_agents.stages.head import HeadStats, RouteStage, generate_over_route
        from swarm.pipeline.client import StageError

        a = self.assignment
        if self._eog is None:
            self._eog = frozenset(eog_token_ids(self.model_dir))
        route = [RouteStage(h.peer_id, h.start, h.end) for h in a.route]
        spares = [RouteStage(h.peer_id, h.start, h.end) for h in a.spares]
        await self._dial(host, list(a.route) + list(a.spares))
        s = lease.sampling
        results: dict[str, GroupResult] = {}
        all_stats: list[HeadStats] = []
        replayed, failed, lost, why = [], [], set(), []
        tokens = 0
        t0 = time.perf_counter()

        async def one(g) -> None:
            nonlocal tokens
            params = SamplingParams(s.temperature, s.top_p, s.max_tokens, group_seed(s.seed, g.group_id))
            stats = HeadStats()
            all_stats.append(stats)
            try:
                comps = await generate_over_route(
                    host, route, a.n_layers, g.prompt_ids, lease.group_size, params, lease.version, eog=self._eog,
                    n_ctx=self.cfg.n_ctx, wire_dtype=self.cfg.wire_dtype, stats=stats, spares=spares,
                    local={host.peer_id: self.stage})
            except (StageError, ValueError, SwarmError) as e:
                failed.append(g.group_id)
                if isinstance(e, StageError) and e.lost:
                    lost.add(e.peer_id)
                why.append(f"{type(e).__name__}: {e}")
                return
            if stats.replays:
                replayed.append(g.group_id)
                lost.update(p for _, _, p in stats.replays)
            tokens += sum(len(c.token_ids) for c in comps)
            results[g.group_id] = GroupResult(group_id=g.group_id, version=lease.version, completions=[
                Completion(c.token_ids, c.logprobs, c.finish_reason) for c in comps])

        async with trio.open_nursery() as nursery:
            for g in lease.groups:
                nursery.start_soon(one, g)
        gen_s = time.perf_counter() - t0
        self._measure_depth(host, route, a.in_flight, all_stats)
        if replayed or failed:
            self.replayed += len(replayed)
            self.handed_back += len(failed)
            report = StageReport(lease_id=lease.lease_id, replayed=replayed, failed=failed,
                                 lost_peers=sorted(p for p in lost if p and p != "?"), reason="; ".join(why)[:500])
            try:
                await host.request(peer, STAGE_REPORT, report, StageReportAck, timeout=self.cfg.request_timeout_s)
            except (SwarmError, WireError) as e:  # the lease's expiry re-issues them instead
                log.warning("could not report the failover of lease %s: %s", lease.lease_id, e)
            self.say(f"lease {lease.lease_id}: {len(replayed)} group(s) replayed into a spare, {len(failed)} handed "
                     f"back to the learner; lost {[p[-6:] for p in lost]}: {'; '.join(why)[:200]}")
        ordered = [results[g.group_id] for g in lease.groups if g.group_id in results]
        if not ordered:
            return
        pushed, note = await self._push(host, peer, lease, ordered, gen_s, tokens)
        self.say(f"v{lease.version} lease {lease.lease_id} over {len(route)} stage(s): {len(ordered)} group(s), "
                 f"{tokens} tok in {gen_s:.1f}s ({tokens / max(gen_s, 1e-9):.0f} tok/s), pushed {pushed} "
                 f"(total {self.pushed_completions}){note}")


    def _measure_depth(self, host, route, cap: int, stats: list) -> None:
        """Groups to keep in flight next time: each hop's compute per step (as its stage reported
        it, over this lease's groups) and the round trip of the head's link to it (the muxer's
        measurement; 0 for the head's own stage)."""
        from swarm.pipeline.depth import groups_in_flight

        steps = sum(st.steps for st in stats)
        if not steps or any(len(st.busy_s) != len(route) for st in stats if st.steps):
            return
        busy = [sum(st.busy_s[i] for st in stats if st.steps) / steps for i in range(len(route))]
        rtt = [0.0 if r.peer_id == host.peer_id else (host.rtt(r.peer_id) or 0.0) for r in route]
        depth = groups_in_flight(busy, [b + t for b, t in zip(busy, rtt)], cap=max(1, cap))
        if depth != self.depth:
            log.info("pipeline depth: %d group(s) in flight (compute per step %s ms, round trips %s ms, cap %d)",
                     depth, [round(1000 * b, 1) for b in busy], [round(1000 * t, 1) for t in rtt], cap)
        self.depth = depth


def stage_capabilities(backend: str, spec: ModelSpec, memory_bytes: int, tokens_per_s: float, hw) -> Capabilities:
    """The hello of a stage node: memory = its cap, the model geometry, a speed estimate."""
    device = hw.gpu_name if hw.kind == "cuda" else f"cpu ({hw.cores} cores)"
    extra = {**hw.extra(), "stage": "1", "stage_model": json.dumps(asdict(spec), sort_keys=True)}
    return Capabilities(backend=f"pipeline-{backend}", device=device, memory_bytes=int(memory_bytes),
                        tokens_per_s=float(tokens_per_s), extra=extra)
