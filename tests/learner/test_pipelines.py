"""Pipelines inside the learner: planning from hellos, assignments, the lease gate (pure), the
failover paths in the coordinator's ledger, and the service's long poll for stage nodes."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import trio

from learner.coordinator import COMPLETED, LEASED, PENDING, Coordinator, GroupSpec, Limits
from learner.config import PipelineConfig
from learner.pipelines import (PipelineManager, assign_replicas, parse_stage_hello,
                               pipeline_ready)
from swarm.pipeline.allocate import ModelSpec, Stage
from swarm.proto.hello import Hello
from swarm.proto.rollouts import Completion, GroupResult
from swarm.proto.stage import StageAssignment, StageReport
from swarm.proto.work import WorkReply, WorkRequest

#: SmolLM2-135M in fp32, as a stage node reports it.
SMOL = ModelSpec(n_layers=30, layer_bytes=14155776, embed_bytes=113246208, head_bytes=113248512,
                 kv_bytes_per_token=1536, head_compute_layers=8.0)
MB = 1_000_000


def stage_hello(mem: int, tps: float = 10.0, spec: ModelSpec = SMOL) -> Hello:
    h = Hello(backend="pipeline-torch", device="cpu", memory_bytes=mem, tokens_per_s=tps,
              extra={"stage": "1", "stage_model": json.dumps(asdict(spec))})
    h.addrs = [f"/ip4/127.0.0.1/tcp/1/p2p/x{mem}"]
    return h


def whole_hello() -> Hello:
    return Hello(backend="llamacpp", device="cpu", memory_bytes=16_000 * MB, tokens_per_s=150.0)


def manager(**kw) -> PipelineManager:
    return PipelineManager(group_size=2, max_tokens=8, settings=PipelineConfig(**kw))


def held(mgr: PipelineManager, peer: str, a: StageAssignment) -> None:
    mgr.report(peer, WorkRequest(have_version=a.version, max_groups=1, layer_start=a.start, layer_end=a.end,
                                 pipeline_id=a.pipeline_id), now=1.0)


def test_parse_stage_hello():
    assert parse_stage_hello({}) is None
    assert parse_stage_hello(stage_hello(300 * MB).extra) == SMOL
    with pytest.raises(ValueError, match="geometry"):
        parse_stage_hello({"stage": "1", "stage_model": "{not json"})
    with pytest.raises(ValueError, match="geometry"):
        parse_stage_hello({"stage": "1", "stage_model": json.dumps({"n_layers": 0, "layer_bytes": 1,
                                                                    "embed_bytes": 0, "head_bytes": 0,
                                                                    "kv_bytes_per_token": 0})})
    with pytest.raises(ValueError, match="unexpected"):
        parse_stage_hello({"stage": "1", "stage_model": json.dumps({**asdict(SMOL), "evil": 1})})


def test_pipeline_ready_gate():
    stages = (Stage("a", 0, 10), Stage("b", 10, 20), Stage("c", 20, 30))
    good = {"a": ("p0", 0, 10, 3), "b": ("p0", 10, 20, 3), "c": ("p0", 20, 30, 3)}
    assert pipeline_ready(stages, "p0", good, 3)
    assert not pipeline_ready(stages, "p0", good, 4)  # the lease's version is newer than what they hold
    assert not pipeline_ready(stages, "p1", good, 3)  # held for another pipeline
    assert not pipeline_ready(stages, "p0", {**good, "b": ("p0", 10, 20, 2)}, 3)  # one stage stale
    assert not pipeline_ready(stages, "p0", {**good, "c": ("p0", 19, 30, 3)}, 3)  # wrong range
    assert not pipeline_ready(stages, "p0", {k: v for k, v in good.items() if k != "c"}, 3)  # stage gone
    assert not pipeline_ready((), "p0", good, 3)


def test_three_capped_nodes_form_one_pipeline_beside_a_whole_node():
    mgr = manager()
    mgr.join("llama", whole_hello(), 0.0)
    assert mgr.plan is None and not mgr.has_stages()  # no stage geometry known: nothing to plan
    for p in ("s1", "s2"):
        mgr.join(p, stage_hello(300 * MB), 0.0)
    assert [len(p["stages"]) for p in mgr.summary()["pipelines"]] == [1]  # two caps are too small
    assert set(mgr.summary()["spare"]) == {"s1", "s2"}
    mgr.join("s3", stage_hello(300 * MB), 0.0)
    pipes = mgr.summary()["pipelines"]
    assert sorted(len(p["stages"]) for p in pipes) == [1, 3]
    three = next(p for p in pipes if len(p["stages"]) == 3)
    ranges = [(s, e) for _, s, e in three["stages"]]
    assert ranges[0][0] == 0 and ranges[-1][1] == 30 and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    head = three["stages"][0][0]
    # assignments: each stage is told its own range and the whole route
    assigns = {p: mgr.update_for(p, 0) for p in ("s1", "s2", "s3")}
    assert all(a is not None and a.pipeline_id == three["id"] for a in assigns.values())
    assert [(h.start, h.end) for h in assigns[head].route] == ranges and assigns[head].head
    assert mgr.update_for("llama", 0) is None  # whole-model nodes use the ordinary path
    # the head may lease only once every stage holds the range at the version
    assert not mgr.may_lease(head, 0)
    for p, a in assigns.items():
        held(mgr, p, a)
        assert mgr.update_for(p, 0) is None
    assert mgr.may_lease(head, 0)
    assert not any(mgr.may_lease(p, 0) for p in ("s1", "s2", "s3") if p != head)
    # a new version: every stage must fetch it before the head gets work again
    assert not mgr.may_lease(head, 1)
    assert all(mgr.update_for(p, 1).version == 1 for p in ("s1", "s2", "s3"))
    # a stage lost: re-planned without it; the rest cannot cover the model and hold no layers
    lost = next(p for p in ("s1", "s2", "s3") if p != head)
    mgr.leave(lost, 2.0, "lost")
    assert not mgr.may_lease(head, 0)
    assert mgr.update_for(head, 0).pipeline_id == ""
    assert [len(p["stages"]) for p in mgr.summary()["pipelines"]] == [1]


def test_geometry_mismatch_is_refused():
    mgr = manager()
    mgr.join("s1", stage_hello(300 * MB), 0.0)
    other = ModelSpec(**{**asdict(SMOL), "n_layers": 24})
    with pytest.raises(ValueError, match="differs"):
        mgr.join("s2", stage_hello(300 * MB, spec=other), 0.0)


def test_leftover_stage_nodes_become_replicas_listed_as_spares():
    # four slow-ish capped nodes: three form the pipeline; the fourth would not raise its
    # throughput (hop cost) and copies one hop instead
    mgr = manager(hop_s=10.0, cooldown_s=60.0)
    for p in ("s1", "s2", "s3", "s4"):
        mgr.join(p, stage_hello(300 * MB), 0.0)
    pipes = mgr.summary()["pipelines"]
    assert len(pipes) == 1 and len(pipes[0]["stages"]) == 3, pipes
    (spare,) = mgr.summary()["spare"]
    assert spare in mgr.replicas
    pid, hop = mgr.replicas[spare]
    a = mgr.update_for(spare, 0)
    assert (a.pipeline_id, a.start, a.end) == (pid, hop.start, hop.end) and not a.head
    head = pipes[0]["stages"][0][0]
    assert mgr.assignment(head, 0).spares == []  # not yet holding the range at the version
    held(mgr, spare, a)
    (sp,) = mgr.assignment(head, 0).spares
    assert (sp.peer_id, sp.start, sp.end) == (spare, hop.start, hop.end)


def test_assign_replicas_fits_capacity_and_spreads():
    from swarm.pipeline.allocate import Pipeline, Plan

    plan = Plan((Pipeline((Stage("a", 0, 10), Stage("b", 10, 20), Stage("c", 20, 30)), 1.0),), spare=("x", "y", "z"))
    out = assign_replicas(plan, {"x": 12, "y": 19, "z": 3}, e_first=8, e_last=8)
    assert out["y"][1] == Stage("b", 10, 20)  # the largest spare first: both hops fit, ties by order
    assert out["x"][1] == Stage("b", 10, 20)  # 12 layers: only the middle hop (10) fits, not 10 + 8
    assert "z" not in out  # too small for any hop; the head's hop [0, 10) is never copied
    out = assign_replicas(plan, {"x": 19, "y": 19}, e_first=8, e_last=8)
    assert {out["x"][1], out["y"][1]} == {Stage("b", 10, 20), Stage("c", 20, 30)}  # spread


def make_coord(n=3):
    c = Coordinator(Limits(group_size=2, max_tokens=8, vocab_size=100), lease_timeout_s=100.0, groups_per_lease=3)
    c.add_groups([GroupSpec(f"g{i}", [1, 2], str(i)) for i in range(n)])
    return c


def result(gid):
    return GroupResult(gid, 0, [Completion([5, 6], [-0.1, -0.2], "stop") for _ in range(2)])


def test_release_groups_requeues_at_once_and_notes_the_path():
    c = make_coord()
    lease = c.lease("head", 3, now=0.0)
    assert c.release_groups("other", lease.lease_id, ["g0"], "stage_lost: re-leased") == []  # not its lease
    back = c.release_groups("head", lease.lease_id, ["g1", "g2", "nope"], "stage_lost: re-leased")
    assert back == ["g1", "g2"]
    assert c.ledger == {"g0": LEASED, "g1": PENDING, "g2": PENDING}
    assert c.ledger.pending_order()[:2] == ["g1", "g2"]
    assert c.notes["g1"] == [f"stage_lost: re-leased ({lease.lease_id})"]
    assert c.failovers["stage_lost: re-leased"] == 2
    # re-leased elsewhere and completed there; a second release of the same groups does nothing
    other = c.lease("llama", 3, now=1.0)
    assert other.group_ids == ["g1", "g2"]
    assert c.release_groups("head", lease.lease_id, ["g1"], "stage_lost: re-leased") == []
    acc, _ = c.submit("llama", other.lease_id, [result("g1"), result("g2")], now=2.0)
    acc0, _ = c.submit("head", lease.lease_id, [result("g0")], now=2.0)
    assert acc == ["g1", "g2"] and acc0 == ["g0"]
    assert set(c.ledger.values()) == {COMPLETED} and not c.ledger.leases
    c.take(["g0", "g1", "g2"])
    with pytest.raises(ValueError):
        c.take(["g1"])


def test_record_replayed():
    c = make_coord(1)
    lease = c.lease("head", 1, now=0.0)
    assert c.record_replayed("head", lease.lease_id, ["g0", "zz"]) == 1
    assert c.record_replayed("intruder", lease.lease_id, ["g0"]) == 0
    assert c.notes["g0"] == [f"replayed ({lease.lease_id})"] and c.failovers["replayed"] == 1


def _service():
    from learner.service import LearnerService, SamplingDefaults, ServiceSettings

    c = make_coord(2)
    return LearnerService(c, ServiceSettings(SamplingDefaults(1.0, 1.0, 8, 0), group_size=2, run_id="r",
                                             model_name="m", long_poll_s=0.5))


def test_a_stage_leaves_only_on_evidence_from_its_own_pipeline_confirmed_by_the_learners_probe():
    from learner.service import LearnerService, SamplingDefaults, ServiceSettings

    probed: list[str] = []
    answers = {"s2": True, "s3": False}

    async def probe(peer: str) -> bool:
        probed.append(peer)
        return answers[peer]

    async def main():
        svc = LearnerService(make_coord(2), ServiceSettings(SamplingDefaults(1.0, 1.0, 8, 0), group_size=2,
                                                            run_id="r", model_name="m", long_poll_s=0.5),
                             probe=probe)
        for p in ("s1", "s2", "s3"):
            assert (await svc.on_hello(stage_hello(300 * MB), p)).accepted
        assert (await svc.on_hello(whole_hello(), "whole")).accepted
        stages = {st[0] for st in svc.pipelines.summary()["pipelines"][0]["stages"]}
        assert stages == {"s1", "s2", "s3"} and svc.pipelines.pipeline_peers("whole") == {"whole"}
        # any node that said hello may report, but a report about another pipeline is no evidence
        await svc.on_stage_report(StageReport(lease_id="L0", replayed=[], failed=[], lost_peers=["s2", "s3"],
                                              reason="made up"), "whole")
        assert probed == [] and all(svc.pipelines.is_stage(p) for p in stages)
        # the pipeline's own head: its claims are probed; the stage that answers stays
        await svc.on_stage_report(StageReport(lease_id="L0", replayed=[], failed=[], lost_peers=["s2", "s3", "s3"],
                                              reason="lost"), "s1")
        assert probed == ["s2", "s3"]
        assert svc.pipelines.is_stage("s2") and not svc.pipelines.is_stage("s3")

    trio.run(main)


def test_service_stage_poll_assigns_then_leases_only_to_a_ready_head():
    async def main():
        svc = _service()
        peers = ("s1", "s2", "s3")
        for p in peers:
            ack = await svc.on_hello(stage_hello(300 * MB), p)
            assert ack.accepted
        head = svc.pipelines.summary()["pipelines"][0]["stages"][0][0]
        first = {p: await svc.on_work(WorkRequest(have_version=-1, max_groups=1), p) for p in peers}
        assert all(r.lease is None and r.stage is not None for r in first.values())
        # the head reports its range before the others: no lease yet (the gate)
        a = first[head].stage
        req = WorkRequest(have_version=0, max_groups=1, layer_start=a.start, layer_end=a.end, pipeline_id=a.pipeline_id)
        r = await svc.on_work(req, head)
        assert r.lease is None and r.stage is None and r.reason == "no_work"
        for p in peers:
            if p != head:
                b = first[p].stage
                svc.pipelines.report(p, WorkRequest(have_version=0, max_groups=1, layer_start=b.start,
                                                    layer_end=b.end, pipeline_id=b.pipeline_id), trio.current_time())
        r = await svc.on_work(req, head)
        assert isinstance(r, WorkReply) and r.lease is not None and r.stage.head
        # a stage dies mid-lease: the head's report puts the group back at once
        ack = await svc.on_stage_report(StageReport(lease_id=r.lease.lease_id, replayed=[],
                                                    failed=[g.group_id for g in r.lease.groups],
                                                    lost_peers=[p for p in peers if p != head][:1],
                                                    reason="lost"), head)
        assert ack.requeued == [g.group_id for g in r.lease.groups]
        assert svc.coordinator.ledger[ack.requeued[0]] == PENDING
        assert svc.swarm_summary()["failovers"] == {"stage_lost: re-leased": 1}
        assert not svc.pipelines.may_lease(head, 0)
        # the stage adapter path slices by layer range
        from learner.service import Refused
        from swarm.proto.adapter import AdapterReply, TensorBlob
        from swarm.proto.stage import StageAdapterRequest

        blob = TensorBlob("float32", [1], b"\0\0\0\0")
        svc.versions.add(AdapterReply(0, 8, 16.0, ["q_proj"], {
            "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight": blob,
            "base_model.model.model.layers.12.self_attn.q_proj.lora_A.weight": blob}))
        sliced = await svc.on_stage_adapter(StageAdapterRequest(0, 0, 10), head)
        assert list(sliced.tensors) == ["base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"]
        assert len(svc.versions.get(0).tensors) == 2  # the published version is untouched
        with pytest.raises(Refused):
            await svc.on_stage_adapter(StageAdapterRequest(5, 0, 10), head)  # not published
        with pytest.raises(Refused):
            await svc.on_stage_adapter(StageAdapterRequest(0, 4, 4), head)  # an empty range

    trio.run(main)


@pytest.mark.parametrize("group, max_tokens", [(2, 8), (8, 64), (16, 512)])
def test_demo_cap_makes_exactly_one_three_stage_pipeline(group, max_tokens):
    from learner.demo import stage_cap_bytes
    from swarm.pipeline.allocate import NodeSpec, RunSpec, form_pipelines

    ps = PipelineConfig()
    run = RunSpec(group, max_tokens + ps.prompt_tokens, ps.in_flight)
    cap = stage_cap_bytes(SMOL, run, ps)
    nodes = [NodeSpec(f"s{i}", cap, 10.0) for i in range(3)]
    plan = form_pipelines(nodes, SMOL, run, ps)
    assert [len(p.stages) for p in plan.pipelines] == [3]
    assert form_pipelines(nodes[:2], SMOL, run, ps).pipelines == ()


def test_geometry_out_of_range_is_refused():
    for bad in ({"n_layers": 10**6}, {"layer_bytes": 1 << 50}, {"head_compute_layers": float("nan")},
                {"n_layers": "many"}, {"kv_bytes_per_token": -1}):
        with pytest.raises(ValueError, match="geometry"):
            parse_stage_hello({"stage": "1", "stage_model": json.dumps({**asdict(SMOL), **bad})})


def test_the_learners_probe_opens_a_stage_stream_and_fails_on_a_gone_peer(tmp_path):
    from learner.stage_requests import stage_alive
    from swarm.host import open_host
    from swarm.pipeline.proto import PIPELINE

    async def main():
        with trio.fail_after(30):
            await probe_then_stop()

    async def probe_then_stop():
        async with open_host(tmp_path / "L", listen_addr="/ip4/127.0.0.1/tcp/0") as learner:
            async with open_host(tmp_path / "S", listen_addr="/ip4/127.0.0.1/tcp/0") as stage:
                async def serve(stream, peer):
                    await stream.close()
                stage.set_stream_handler(PIPELINE, serve)
                await learner.connect(stage.addrs[0])
                stage_id = stage.peer_id
                assert await stage_alive(learner, stage_id, timeout_s=5.0)
            assert not await stage_alive(learner, stage_id, timeout_s=2.0)  # gone

    trio.run(main)


def test_lease_cap_grows_with_the_stages_spare_memory():
    def head_and_cap(mem: int, **kw) -> tuple[PipelineManager, str, int]:
        mgr = manager(**kw)
        for p in ("s1", "s2", "s3"):
            mgr.join(p, stage_hello(mem), 0.0)
        stages = max(mgr.summary()["pipelines"], key=lambda p: len(p["stages"]))["stages"]
        return mgr, stages[0][0], mgr.lease_cap(stages[0][0])

    _, _, tight = head_and_cap(300 * MB, max_in_flight=16)
    mgr, head, roomy = head_and_cap(2_000 * MB, max_in_flight=16)
    # 300 MB nodes hold 10 layers of SmolLM2 with 2 groups' KV each: little room for more groups
    assert 2 <= tight < roomy == 16
    assert mgr.update_for(head, 0).in_flight == 16  # the head is told its cap
    assert head_and_cap(2_000 * MB, max_in_flight=2)[2] == 2
    assert mgr.lease_cap("nobody") == mgr.settings.in_flight
