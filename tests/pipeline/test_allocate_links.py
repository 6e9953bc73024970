"""The pipeline planner over links: a pipeline's head links with every stage (routing is a star),
a NAT'd node serves as a stage of a dialable head and is told to dial the head, a group with no
such head is left spare, and without links nothing changes."""

from __future__ import annotations

import json
from dataclasses import asdict

from learner.config import PipelineConfig
from learner.pipelines import PipelineManager
from swarm.discovery.links import Links, links_from
from swarm.pipeline.allocate import ModelSpec, NodeSpec, PlanConfig, RunSpec, build_pipeline, form_pipelines, replan
from swarm.proto.hello import Hello

MODEL = ModelSpec(n_layers=10, layer_bytes=100, embed_bytes=0, head_bytes=0, kv_bytes_per_token=0)
RUN = RunSpec(group_size=1, max_tokens=1)
CFG = PlanConfig(usable_fraction=1.0)


def node(name: str, layers: int, tps: float = 1.0) -> NodeSpec:
    return NodeSpec(name, memory_bytes=layers * 100, tokens_per_s=tps)


def test_the_head_is_a_member_that_links_with_all_others():
    # "nat" has the largest capacity and would be the head; it cannot link with "nat2"
    members = [node("nat", 6), node("pub", 4), node("nat2", 3)]
    links = links_from(["pub"])
    free = build_pipeline(members, MODEL, RUN, CFG)
    assert free.stages[0].node_id == "nat"
    linked = build_pipeline(members, MODEL, RUN, CFG, links.can_link)
    assert linked is not None and linked.stages[0].node_id == "pub"
    assert sum(s.n_layers for s in linked.stages) == 10
    assert all(links.can_link("pub", s.node_id) for s in linked.stages[1:])


def test_a_group_nobody_can_head_is_spare():
    members = [node("a", 5), node("b", 5)]  # both NAT'd, no punch
    plan = form_pipelines(members, MODEL, RUN, CFG, can_link=links_from([]).can_link)
    assert plan.pipelines == () and set(plan.spare) == {"a", "b"}
    punched = links_from([], [("a", "b", True, "")])
    plan = form_pipelines(members, MODEL, RUN, CFG, can_link=punched.can_link)
    assert len(plan.pipelines) == 1 and not plan.spare


def test_without_links_nothing_changes():
    members = [node(f"n{i}", 3 + i % 3, 1.0 + i) for i in range(9)]
    everyone = Links(dialable=frozenset(m.node_id for m in members))
    assert form_pipelines(members, MODEL, RUN, CFG) == form_pipelines(members, MODEL, RUN, CFG,
                                                                      can_link=everyone.can_link)


def test_replan_reforms_a_pipeline_whose_head_lost_a_link():
    members = [node("pub", 6), node("nat", 5)]
    before = form_pipelines(members, MODEL, RUN, CFG, can_link=links_from(["pub", "nat"]).can_link)
    assert before.pipelines[0].stages[0].node_id == "pub"
    # both NAT'd now: no member can head the pair any more
    after = replan(before, members, MODEL, RUN, CFG, now=1.0, can_link=links_from([]).can_link)
    assert after.pipelines == () and set(after.spare) == {"pub", "nat"}


SMOL = ModelSpec(n_layers=30, layer_bytes=14155776, embed_bytes=113246208, head_bytes=113248512,
                 kv_bytes_per_token=1536, head_compute_layers=8.0)
MB = 1_000_000


def stage_hello(mem: int, peer: str) -> Hello:
    h = Hello(backend="pipeline-torch", device="cpu", memory_bytes=mem, tokens_per_s=10.0,
              extra={"stage": "1", "stage_model": json.dumps(asdict(SMOL))})
    h.addrs = [f"/ip4/10.0.0.1/tcp/1/p2p/{peer}"]
    return h


def test_a_nat_stage_is_told_to_dial_its_head():
    links = {"now": links_from(["s1", "s2"])}  # s3 cannot be dialled
    mgr = PipelineManager(group_size=2, max_tokens=8, settings=PipelineConfig(),
                          links=lambda members: links["now"])
    for p in ("s1", "s2", "s3"):
        mgr.join(p, stage_hello(300 * MB, p), now=0.0)
    (pipe,) = mgr.plan.pipelines
    head = pipe.stages[0].node_id
    assert head != "s3" and "s3" in pipe.node_ids
    assert mgr.assignment("s3", 0).dial == [head]
    assert all(mgr.assignment(p, 0).dial == [] for p in ("s1", "s2"))
    assert mgr.assignment(head, 0).head


def test_the_head_is_the_member_nearest_the_others_when_round_trips_are_known():
    members = [node("big", 6), node("mid", 5), node("near", 4)]
    to_learner = {"big": 0.15, "mid": 0.12, "near": 0.03}

    def rtt(a: str, b: str) -> float:
        return to_learner[a] + to_learner[b]

    assert build_pipeline(members, MODEL, RUN, CFG).stages[0].node_id == "big"  # by capacity alone
    near = build_pipeline(members, MODEL, RUN, CFG, rtt=rtt)
    assert near.stages[0].node_id == "near" and sum(s.n_layers for s in near.stages) == 10
    assert near.stages[-1].node_id == "big"  # the largest capacity left takes the other end
    # the nearest cannot head it (the embedding does not fit beside a layer): the next nearest does
    model = ModelSpec(n_layers=10, layer_bytes=100, embed_bytes=350, head_bytes=0, kv_bytes_per_token=0)
    members = [node("big", 9), node("mid", 8), node("near", 3)]
    assert build_pipeline(members, model, RUN, CFG, rtt=rtt).stages[0].node_id == "mid"
    plan = form_pipelines(members, model, RUN, CFG, rtt=rtt)
    assert plan.pipelines[0].stages[0].node_id == "mid"
