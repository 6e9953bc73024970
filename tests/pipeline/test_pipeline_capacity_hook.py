"""``swarm-bench capacity --pipeline-nodes``: the allocator's pipelines become capacity-model workers."""

from __future__ import annotations

import pytest

from bench.capacity.pipelines import describe, parse_nodes, plan_classes
from swarm.pipeline.allocate import ModelSpec

MODEL = ModelSpec(n_layers=10, layer_bytes=100_000_000, embed_bytes=0, head_bytes=0, kv_bytes_per_token=0)


def test_parse_nodes():
    nodes, cost = parse_nodes("lap:mem_gb=0.5,tok_s=20,count=3,cost_h=0.02")
    assert [n.node_id for n in nodes] == ["lap0", "lap1", "lap2"] and cost == 0.02
    assert nodes[0].memory_bytes == 500_000_000 and nodes[0].tokens_per_s == 20 and not nodes[0].whole_only
    (cpp,), _ = parse_nodes("cpp:mem_gb=8,tok_s=100,whole=1")
    assert cpp.whole_only
    for bad in ("", ":mem_gb=1,tok_s=1", "x:mem_gb=1", "x:mem_gb=1,tok_s=1,count=0", "x:mem_gb=1,tok_s=abc",
                "x:mem=1,tok_s=1"):
        with pytest.raises(ValueError):
            parse_nodes(bad)


def test_pipelines_become_workers():
    # 6 nodes of 5 layers each (0.9 * 0.56 GB / 0.1 GB) -> three 2-stage pipelines; one big node alone
    specs = ["n:mem_gb=0.56,tok_s=10,count=6,cost_h=0.01", "big:mem_gb=2,tok_s=50,cost_h=0.1"]
    plan, classes = plan_classes(specs, MODEL, group_size=4, seq_tokens=64, ctoks=32.0)
    assert len(plan.pipelines) == 4 and len(classes) == 4
    big = next(c for c in classes if "big" in c.name)
    assert big.group_s == pytest.approx(4 * 32 / 50) and big.cost_per_h == pytest.approx(0.1)
    pairs = [c for c in classes if "big" not in c.name]
    # two equal nodes of speed 10 sharing the layers: 20 tok/s with groups in flight
    assert all(c.group_s == pytest.approx(4 * 32 / 20) and c.cost_per_h == pytest.approx(0.02) for c in pairs)
    assert all(c.max_count == 1 for c in classes)
    assert "4 pipelines" in describe(plan)
    with pytest.raises(ValueError):
        plan_classes(["a:mem_gb=1,tok_s=1", "a:mem_gb=1,tok_s=1"], MODEL, 4, 64, 32.0)
