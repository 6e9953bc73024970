"""Pipelines in the capacity plan: nodes too small for the model, grouped by the allocator.

``--pipeline-nodes NAME:mem_gb=..,tok_s=..[,count=..,cost_h=..,whole=1]`` (repeatable)
describes nodes by memory and whole-model speed (``tok_s``: tokens/s it would decode running
the whole model; estimate it for a node that cannot hold the model). The allocator
(:func:`swarm.pipeline.allocate.form_pipelines`, the same one the learner will use) groups
them into pipelines for the run's group size and sequence length; each pipeline then enters
the capacity model as one worker (its predicted tokens/s with groups in flight, the sum of
its members' hourly cost), and nodes that hold the whole model as one-stage pipelines.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.capacity.model import WorkerClass
from swarm.pipeline.allocate import ModelSpec, NodeSpec, Plan, PlanConfig, RunSpec, form_pipelines, model_spec_from_hf_config

NODE_KEYS = ("mem_gb", "tok_s", "count", "cost_h", "whole")


def parse_nodes(spec: str) -> tuple[list[NodeSpec], float]:
    """One ``--pipeline-nodes`` spec -> (nodes, cost per node-hour). ``ValueError`` if bad."""
    name, _, rest = spec.partition(":")
    name = name.strip()
    if not name:
        raise ValueError(f"pipeline node spec {spec!r}: missing a name")
    kv: dict[str, float] = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, val = item.partition("=")
        if not eq or key not in NODE_KEYS:
            raise ValueError(f"pipeline node spec {spec!r}: {item!r} is not key=value with key in {', '.join(NODE_KEYS)}")
        try:
            kv[key] = float(val)
        except ValueError:
            raise ValueError(f"pipeline node spec {spec!r}: {key} needs a number, got {val!r}") from None
    if kv.get("mem_gb", 0) <= 0 or kv.get("tok_s", 0) <= 0:
        raise ValueError(f"pipeline node spec {spec!r}: give mem_gb > 0 and tok_s > 0")
    count = int(kv.get("count", 1))
    if count < 1:
        raise ValueError(f"pipeline node spec {spec!r}: count must be at least 1")
    nodes = [NodeSpec(f"{name}{i}" if count > 1 else name, int(kv["mem_gb"] * 1e9), kv["tok_s"],
                      whole_only=bool(kv.get("whole", 0))) for i in range(count)]
    return nodes, kv.get("cost_h", 0.0)


def model_spec(config_path: str | None, dtype_bytes: int) -> ModelSpec:
    """The allocator's view of a model from a ``config.json`` (default: the embedded model's)."""
    if config_path:
        config = json.loads(Path(config_path).read_text())
    else:
        from node_agents.models import resolve_for_backend

        config = json.loads((resolve_for_backend("default", "torch") / "config.json").read_text())
    return model_spec_from_hf_config(config, dtype_bytes=dtype_bytes)


def plan_classes(specs: list[str], model: ModelSpec, group_size: int, seq_tokens: int, ctoks: float,
                 cfg: PlanConfig = PlanConfig()) -> tuple[Plan, list[WorkerClass]]:
    """The allocator's plan for the nodes in ``specs`` and one worker class per pipeline."""
    nodes, cost = [], {}
    for spec in specs:
        got, c = parse_nodes(spec)
        nodes += got
        cost.update({n.node_id: c for n in got})
    if len({n.node_id for n in nodes}) != len(nodes):
        raise ValueError("pipeline node names must be unique")
    plan = form_pipelines(nodes, model, RunSpec(group_size=group_size, max_tokens=seq_tokens), cfg)
    classes = []
    for i, p in enumerate(plan.pipelines):
        members = "+".join(f"{s.node_id}[{s.start},{s.end})" for s in p.stages)
        classes.append(WorkerClass(name=f"pipe{i}:{members}", group_s=group_size * ctoks / p.tokens_per_s,
                                   cost_per_h=sum(cost[s.node_id] for s in p.stages), max_count=1))
    return plan, classes


def describe(plan: Plan) -> str:
    lines = [f"allocator: {len(plan.pipelines)} pipelines ({plan.method} covering), "
             f"{plan.tokens_per_s:.1f} tokens/s predicted"]
    for i, p in enumerate(plan.pipelines):
        stages = ", ".join(f"{s.node_id} [{s.start},{s.end})" for s in p.stages)
        lines.append(f"  pipe{i}: {stages}: {p.tokens_per_s:.1f} tok/s")
    if plan.spare:
        lines.append(f"  spare (no pipeline gains from them): {', '.join(plan.spare)}")
    return "\n".join(lines)
