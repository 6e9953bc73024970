"""Layer allocation for pipeline-sharded generation: pure functions over snapshots.

Three decisions, each a pure function:

1. **Capacity** (:func:`layer_capacity`): how many decoder layers a node can hold. A layer
   costs its weights plus its KV cache for the run's whole GRPO group at the longest
   sequence, times the groups kept in flight. The embedding (first stage) and the final
   norm + LM head (last stage) are charged in *layer equivalents* (:func:`end_costs`), so a
   pipeline of middle-stage capacities ``c_i`` is feasible when
   ``sum c_i >= L + e_first + e_last``.
2. **Formation** (:func:`form_pipelines`): which nodes make up how many pipelines. Nodes that
   hold the whole model (or that can only serve whole models, e.g. llama.cpp) are one-stage
   pipelines: a split would only add hops and bubbles. The others are grouped as in Parallax:
   for every k, ``s*(k)`` is the fewest stages that cover k pipelines, and the k maximising
   ``k^2 / s*(k)`` wins (k pipelines in parallel, each ``s*/k`` stages deep). ``s*(k)`` is a
   bin-covering problem (NP-hard): it is solved exactly by a memoised search over the sorted
   residuals of the open pipelines when the search stays under ``PlanConfig.exact_state_limit``
   states, else by Parallax's one-open-pipeline-at-a-time DP over nodes sorted by capacity
   (polynomial, may miss a covering; the plan says which was used).
   *Departure from Parallax:* nodes left over after formation join the pipeline whose
   predicted throughput they raise most. In RL post-training rollouts are throughput-bound,
   and an idle node is waste; a node that would not help (the hop cost outweighs its speed)
   stays out and the plan lists it as ``spare``. Then any member whose removal raises its
   pipeline's throughput is dropped to ``spare`` (the fewest-stages covering ignores speed).
3. **Water-filling** (:func:`water_fill`): inside a pipeline, stage ``i`` gets
   ``l_i = min(cap_i, lambda * v_i - o_i)`` layers with ``lambda`` chosen (bisection) so that
   the ``l_i`` sum to ``L``, where ``o_i`` is fixed work: the LM head's compute on the last
   stage (``ModelSpec.head_compute_layers``; about 8 layers for SmolLM2-135M, whose head is
   large against its layers); rounded by largest remainder without exceeding a capacity and with at
   least one layer per stage. The two largest-capacity nodes take the end stages (they absorb
   the embedding and the head). Stages are ordered first, middles (fastest first), last.

Latency (``rtt``, optional): the head drives every stage in turn, so a pipeline's round trips
are those between its head and each other stage. Among the members that may head it, the one
with the smallest sum of round trips to the others heads it (the first that gives a feasible
pipeline; capacity breaks ties), so fewer groups in flight hide the latency
(``swarm.pipeline.depth``).

Links (``can_link``, optional): the head drives every stage of its pipeline over a direct
connection (routing is a star), which either side may open (``swarm.discovery.links``: a NAT'd
stage dials a dialable head; a punched pair punches). So the head must be a member that can
link with all the others: :func:`build_pipeline` takes the largest-capacity such member as the
head (the other end stage stays the largest-capacity of the rest); a group with no such member
is not a pipeline and its members are left ``spare``. The covering itself ignores links.

Re-planning (:func:`replan`) keeps intact pipelines, re-forms the rest from orphans and new
nodes, and switches to a full fresh plan only when it predicts at least ``min_gain`` more
throughput and the last full re-plan is ``cooldown_s`` old: the rule against thrashing.

Speeds: ``NodeSpec.tokens_per_s`` is what the node would decode running the *whole* model
alone (measured with ``swarm-node probe``, or estimated), i.e. ``v * (L + H)`` layer units/s
with ``H`` the head's compute. A pipeline with groups in flight runs at its slowest stage:
``1 / max_i ((l_i + o_i) / (v_i * (L + H)) + hop_s)``, with ``hop_s`` the per-token cost of
one hop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from swarm.config import Section, setting
from swarm.pipeline.cover import cover_dp, cover_exact

#: ``can_link(a, b)``: whether peers ``a`` and ``b`` can hold a direct connection.
CanLink = Callable[[str, str], bool]
#: ``rtt(a, b)``: the round trip (s) between peers ``a`` and ``b`` as measured or estimated.
Rtt = Callable[[str, str], float]


@dataclass(frozen=True)
class ModelSpec:
    """What the allocator needs to know about a model, in bytes at the serving dtype."""

    #: Decoder layers ``L``.
    n_layers: int
    #: Weight bytes of one decoder layer.
    layer_bytes: int
    #: Weight bytes of the token embedding (first stage).
    embed_bytes: int
    #: Weight bytes of the final norm and LM head (last stage). With tied embeddings the last
    #: stage still holds a copy of the embedding matrix.
    head_bytes: int
    #: KV-cache bytes per token per layer (``2 * kv_heads * head_dim * dtype_bytes``).
    kv_bytes_per_token: int
    #: Compute of the LM head per token, in decoder-layer equivalents (``vocab * hidden`` over
    #: a layer's weights): fixed work of the last stage that water-filling accounts for.
    head_compute_layers: float = 0.0

    def __post_init__(self) -> None:
        if self.n_layers < 1 or self.layer_bytes < 1:
            raise ValueError("ModelSpec needs n_layers >= 1 and layer_bytes >= 1")
        if min(self.embed_bytes, self.head_bytes, self.kv_bytes_per_token, self.head_compute_layers) < 0:
            raise ValueError("ModelSpec byte counts must not be negative")


@dataclass(frozen=True)
class RunSpec:
    """The run's shape, which sets each stage's KV budget."""

    #: Completions per prompt: a whole GRPO group moves through the pipeline as one batch.
    group_size: int
    #: Longest sequence (prompt + completion) in tokens.
    max_tokens: int
    #: Groups kept in flight per pipeline (micro-batches), each with its own KV cache.
    in_flight: int = 1


@dataclass(frozen=True)
class NodeSpec:
    """One node as the allocator sees it (a snapshot)."""

    #: The node's peer id (or any unique name).
    node_id: str
    #: Memory the node offers for the model (device memory, or its ``--max-memory`` cap).
    memory_bytes: int
    #: Tokens/s the node would decode running the whole model alone (> 0).
    tokens_per_s: float
    #: True when the node can only serve whole models (e.g. a llama.cpp node).
    whole_only: bool = False


@dataclass(frozen=True)
class PlanConfig(Section):
    """Knobs of capacity, formation and re-planning."""

    #: Fraction of ``memory_bytes`` usable for weights + KV (the rest: activations, runtime).
    usable_fraction: float = setting(0.9, gt=0, le=1)
    #: Bytes kept free on every node besides ``usable_fraction`` (framework overhead).
    reserve_bytes: int = setting(0, ge=0)
    #: Per-token cost (s) of one hop between stages (serialisation + transfer), in throughput.
    hop_s: float = setting(0.0, ge=0)
    #: Largest number of memoised search states for the exact ``s*(k)``; above, the DP is used.
    exact_state_limit: int = setting(200_000, ge=1)
    #: Re-plan only when a fresh plan predicts at least this much more throughput (fraction).
    min_gain: float = setting(0.2, ge=0)
    #: Seconds that must pass between two full re-plans.
    cooldown_s: float = setting(60.0, ge=0)


@dataclass(frozen=True)
class Stage:
    """Node ``node_id`` serves layers ``[start, end)``; ``first``/``last`` hold the ends."""

    node_id: str
    start: int
    end: int

    @property
    def n_layers(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Pipeline:
    stages: tuple[Stage, ...]
    #: Predicted tokens/s with enough groups in flight (slowest stage).
    tokens_per_s: float

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(s.node_id for s in self.stages)


@dataclass(frozen=True)
class Plan:
    pipelines: tuple[Pipeline, ...]
    #: Nodes in no pipeline (too small to help, or leftovers that would slow a pipeline down).
    spare: tuple[str, ...] = ()
    #: ``"exact"`` or ``"dp"``: how ``s*(k)`` was found for the chosen k.
    method: str = "exact"
    #: Clock (s) of the last full re-plan, for the anti-thrash rule.
    planned_at: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return sum(p.tokens_per_s for p in self.pipelines)

    def assignment(self) -> dict[str, Stage]:
        return {s.node_id: s for p in self.pipelines for s in p.stages}


# ---------------------------------------------------------------------------- capacity


def end_costs(model: ModelSpec, run: RunSpec) -> tuple[int, int]:
    """``(e_first, e_last)``: the embedding and the head in layer equivalents (rounded up)."""
    unit = _layer_cost(model, run)
    return math.ceil(model.embed_bytes / unit), math.ceil(model.head_bytes / unit)


def _layer_cost(model: ModelSpec, run: RunSpec) -> int:
    kv = model.kv_bytes_per_token * run.group_size * run.max_tokens * run.in_flight
    return model.layer_bytes + kv


def layer_capacity(node: NodeSpec, model: ModelSpec, run: RunSpec, cfg: PlanConfig = PlanConfig()) -> int:
    """Layers (weights + KV) a node can hold as a middle stage; 0 when none fits."""
    usable = node.memory_bytes * cfg.usable_fraction - cfg.reserve_bytes
    return max(0, int(usable // _layer_cost(model, run)))


def model_spec_from_hf_config(config: dict, dtype_bytes: int = 2) -> ModelSpec:
    """A :class:`ModelSpec` from an HF Llama-style ``config.json`` dict (estimates: norms and
    biases are ignored, they are tiny)."""
    h = int(config["hidden_size"])
    inter = int(config["intermediate_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or h // heads)
    vocab = int(config["vocab_size"])
    attn = h * heads * head_dim * 2 + h * kv_heads * head_dim * 2  # q, o and k, v
    mlp = 3 * h * inter
    return ModelSpec(
        n_layers=int(config["num_hidden_layers"]), layer_bytes=(attn + mlp) * dtype_bytes,
        embed_bytes=vocab * h * dtype_bytes, head_bytes=vocab * h * dtype_bytes + h * dtype_bytes,
        kv_bytes_per_token=2 * kv_heads * head_dim * dtype_bytes,
        head_compute_layers=vocab * h / (attn + mlp),
    )


# ---------------------------------------------------------------------------- water-filling


def water_fill(n_layers: int, caps: list[int], speeds: list[float], offsets: list[float] | None = None) -> list[int]:
    """Layers per stage so that every stage's work ``l_i + offsets[i]`` is proportional to its
    speed, capped by ``caps``, at least 1 layer each, summing to ``n_layers`` (largest-remainder
    rounding). ``offsets`` is fixed work in layer equivalents (the LM head on the last stage).
    Raises ``ValueError`` when the capacities cannot hold ``n_layers`` or there are more
    stages than layers."""
    n = len(caps)
    if n == 0 or n > n_layers or sum(caps) < n_layers or min(caps) < 1:
        raise ValueError(f"cannot place {n_layers} layers on capacities {caps}")
    if min(speeds) <= 0:
        raise ValueError("speeds must be positive")
    offs = [0.0] * n if offsets is None else [float(o) for o in offsets]
    if len(offs) != n or min(offs) < 0:
        raise ValueError("offsets must be one non-negative number per stage")

    def share(lam: float) -> list[float]:
        return [min(c, max(1.0, lam * v - o)) for c, v, o in zip(caps, speeds, offs)]

    lo, hi = 0.0, max((c + o) / v for c, v, o in zip(caps, speeds, offs))
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(share(mid)) < n_layers else (lo, mid)
    ideal = share(hi)
    out = [max(1, min(c, math.floor(x))) for c, x in zip(caps, ideal)]
    # largest remainder: hand out (or take back) single layers by how far each is from ideal
    while sum(out) < n_layers:
        i = max((i for i in range(n) if out[i] < caps[i]), key=lambda i: (ideal[i] - out[i], speeds[i]))
        out[i] += 1
    while sum(out) > n_layers:
        i = max((i for i in range(n) if out[i] > 1), key=lambda i: (out[i] - ideal[i], -speeds[i]))
        out[i] -= 1
    return out


def pipeline_throughput(layers: list[int], speeds: list[float], n_layers: int, hop_s: float = 0.0,
                        offsets: list[float] | None = None) -> float:
    """Tokens/s of a pipeline with groups in flight: its slowest stage sets the pace. A node of
    speed ``v`` (whole model, tokens/s) does ``v * (n_layers + sum(offsets))`` layer units/s."""
    offs = [0.0] * len(layers) if offsets is None else offsets
    units = n_layers + sum(offs)
    hops = hop_s if len(layers) > 1 else 0.0
    return 1.0 / max((l + o) / (v * units) + hops for l, v, o in zip(layers, speeds, offs))


def build_pipeline(members: list[NodeSpec], model: ModelSpec, run: RunSpec, cfg: PlanConfig,
                   can_link: CanLink | None = None, rtt: Rtt | None = None) -> Pipeline | None:
    """Order ``members`` into stages and water-fill the layers; ``None`` when they cannot
    hold the model. The two largest-capacity nodes take the ends (embedding, head); with
    ``can_link``, the head is the largest-capacity member that can link with every other one
    (``None`` when there is none); with ``rtt``, the one of those closest to the others (the
    smallest sum of round trips) that gives a feasible pipeline."""
    caps = {m.node_id: layer_capacity(m, model, run, cfg) for m in members}
    e_first, e_last = end_costs(model, run)
    L = model.n_layers
    if len(members) == 1:
        m = members[0]
        if caps[m.node_id] < L + e_first + e_last:
            return None
        return Pipeline((Stage(m.node_id, 0, L),), m.tokens_per_s)
    by_cap = sorted(members, key=lambda m: (-caps[m.node_id], m.node_id))
    heads = by_cap
    if can_link is not None:
        heads = [m for m in by_cap if all(can_link(m.node_id, o.node_id) for o in by_cap if o is not m)]
        if not heads:
            return None
    if rtt is not None:
        heads = sorted(heads, key=lambda h: sum(rtt(h.node_id, o.node_id) for o in by_cap if o is not h))
    else:
        heads = heads[:1]
    for head in heads:
        rest = [m for m in by_cap if m is not head]
        ordered = [head, *sorted(rest[1:], key=lambda m: (-m.tokens_per_s, m.node_id)), rest[0]]
        stage_caps = [caps[m.node_id] for m in ordered]
        stage_caps[0] -= e_first
        stage_caps[-1] -= e_last
        if min(stage_caps) < 1 or sum(stage_caps) < L or len(ordered) > L:
            continue
        speeds = [m.tokens_per_s for m in ordered]
        offsets = [0.0] * (len(ordered) - 1) + [model.head_compute_layers]
        layers = water_fill(L, stage_caps, speeds, offsets)
        stages, start = [], 0
        for m, n in zip(ordered, layers):
            stages.append(Stage(m.node_id, start, start + n))
            start += n
        return Pipeline(tuple(stages), pipeline_throughput(layers, speeds, L, cfg.hop_s, offsets))
    return None


# ---------------------------------------------------------------------------- formation


def form_pipelines(nodes: list[NodeSpec], model: ModelSpec, run: RunSpec, cfg: PlanConfig = PlanConfig(),
                   now: float = 0.0, can_link: CanLink | None = None, rtt: Rtt | None = None) -> Plan:
    """A fresh plan for ``nodes`` (see the module docstring for the rule)."""
    e_first, e_last = end_costs(model, run)
    need = model.n_layers + e_first + e_last
    whole, parts, spare = [], [], []
    for n in sorted(nodes, key=lambda n: n.node_id):
        cap = layer_capacity(n, model, run, cfg)
        if cap >= need:
            whole.append(n)
        elif n.whole_only or cap < 1:
            spare.append(n.node_id)
        else:
            parts.append(n)
    pipelines = [build_pipeline([n], model, run, cfg) for n in whole]
    caps = [layer_capacity(n, model, run, cfg) for n in parts]
    best_k, best_cover, method = 0, [], "exact"
    best_score = 0.0
    for k in range(1, sum(caps) // need + 1):
        try:
            cover, how = cover_exact(caps, need, k, cfg.exact_state_limit), "exact"
        except OverflowError:
            cover, how = cover_dp(caps, need, k), "dp"
        if cover is None:
            continue
        score = k * k / sum(len(c) for c in cover)
        if score > best_score or (score == best_score and k > best_k):
            best_k, best_cover, method, best_score = k, cover, how, score
    groups = [[parts[i] for i in c] for c in best_cover]
    used = {i for c in best_cover for i in c}
    leftovers = sorted((parts[i] for i in range(len(parts)) if i not in used),
                       key=lambda n: (-n.tokens_per_s, n.node_id))
    built = [build_pipeline(g, model, run, cfg, can_link, rtt) for g in groups]
    for node in leftovers:
        gains = []
        for j, g in enumerate(groups):
            trial = build_pipeline(g + [node], model, run, cfg, can_link, rtt)
            current = built[j]
            if trial is not None and current is not None:
                gains.append((trial.tokens_per_s - current.tokens_per_s, j, trial))
        gain = max(gains, key=lambda t: (t[0], -t[1]), default=None)
        if gain is None or gain[0] <= 0:
            spare.append(node.node_id)
            continue
        _, j, trial = gain
        groups[j].append(node)
        built[j] = trial
    for j, g in enumerate(groups):
        groups[j], built[j], dropped = _prune(g, built[j], model, run, cfg, can_link, rtt)
        spare.extend(dropped)
        if built[j] is None and can_link is not None:  # no member links with all the others
            spare.extend(m.node_id for m in groups[j])
    out = [p for p in pipelines + built if p is not None]
    return Plan(tuple(out), tuple(sorted(spare)), method, now)


def _prune(group: list[NodeSpec], built: Pipeline | None, model: ModelSpec, run: RunSpec,
           cfg: PlanConfig, can_link: CanLink | None = None,
           rtt: Rtt | None = None) -> tuple[list[NodeSpec], Pipeline | None, list[str]]:
    """Drop members whose removal raises the pipeline's throughput (a slow node that the
    fewest-stages covering picked, or one whose hop costs more than its speed brings)."""
    dropped: list[str] = []
    while built is not None and len(group) > 1:
        trials = []
        for m in group:
            rest = [x for x in group if x is not m]
            trial = build_pipeline(rest, model, run, cfg, can_link, rtt)
            if trial is not None and trial.tokens_per_s > built.tokens_per_s:
                trials.append((trial.tokens_per_s, m.node_id, rest, trial))
        if not trials:
            break
        _, name, group, built = max(trials, key=lambda t: (t[0], t[1]))
        dropped.append(name)
    return group, built, dropped


def replan(current: Plan, nodes: list[NodeSpec], model: ModelSpec, run: RunSpec,
           cfg: PlanConfig = PlanConfig(), now: float = 0.0, can_link: CanLink | None = None,
           rtt: Rtt | None = None) -> Plan:
    """The plan after joins and leaves (``nodes`` is the new snapshot).

    Intact pipelines (every member still present) are kept as they are; members of broken
    pipelines, spare nodes and newcomers are formed into new pipelines among themselves.
    A fresh plan of all nodes replaces that only when it predicts at least ``cfg.min_gain``
    more throughput *and* ``cfg.cooldown_s`` have passed since the last full plan; so a
    node that flaps, or a small gain, never reshuffles layers (and KV caches) swarm-wide.
    With ``can_link``, a kept pipeline whose head lost a link to a member is re-formed too.
    """
    present = {n.node_id: n for n in nodes}
    kept = [p for p in current.pipelines if all(i in present for i in p.node_ids)
            and (can_link is None or all(can_link(p.node_ids[0], i) for i in p.node_ids[1:]))]
    taken = {i for p in kept for i in p.node_ids}
    rest = [n for n in nodes if n.node_id not in taken]
    extra = form_pipelines(rest, model, run, cfg, now, can_link, rtt)
    incremental = Plan(tuple(kept) + extra.pipelines, extra.spare, extra.method, current.planned_at)
    fresh = form_pipelines(nodes, model, run, cfg, now, can_link, rtt)
    if should_switch(incremental.tokens_per_s, fresh.tokens_per_s, now - current.planned_at, cfg):
        return fresh
    return incremental


def should_switch(current_tps: float, fresh_tps: float, since_last_s: float, cfg: PlanConfig) -> bool:
    """The anti-thrash rule: switch to a fresh global plan only for a clear gain, not too often."""
    if current_tps <= 0:
        return fresh_tps > 0
    return since_last_s >= cfg.cooldown_s and fresh_tps >= current_tps * (1.0 + cfg.min_gain)
