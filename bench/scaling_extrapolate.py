"""The capacity model's answer for the papers' sizes (Qwen3-4B, 8B, 32B): how many consumer nodes
of each kind keep a GPU learner busy at staleness 0, 1 and 2, how long a version takes to reach
them, and what a step costs against the same GPU generating and training by itself.

Every input is either measured by this project or a published figure named in :data:`SOURCES`;
the rest is an assumption and says so (``docs/benchmarks.md`` lists them with the numbers).

- **Learner**: one H200 (bf16 base, LoRA r=8 on all seven projections). *Not measured*: no GPU
  has run this project's trainer yet (``swarm-bench gpu-check`` measures it where one is lent).
  Its step time is an assumption from arithmetic: a LoRA step costs about 6 x parameters x
  tokens FLOPs (forward, and backward through the activations), at :data:`ASSUMED_MFU` of the
  H200's dense bf16 peak (:data:`H200_BF16_FLOPS`), for 64 rollouts of 256 + 512 tokens.
- **Nodes**: llama.cpp on Q4_K_M weights (0.61 bytes per parameter: assumption from Q4_K_M's
  block layout). A single sequence decodes at an effective memory bandwidth over the bytes of
  the weights, calibrated on published RTX 3090 figures (:data:`CALIBRATION`) and taken in
  proportion to each device's memory bandwidth; a GRPO group decodes as one batch, which
  multiplies the rate by :data:`BATCH_GAIN` (from a published batch-8 figure; assumption for
  the other devices).
- **Network**: nodes 100 Mbit/s down, 10 Mbit/s up (home broadband: assumption), the learner
  1 Gbit/s up; the tree of ``dissem`` (fan-out 2, 256 KiB chunks); every version an int3 delta of
  the measured bytes per parameter.
- **Prices**: RunPod's posted rates (:data:`SOURCES`): nodes at spot prices (a node that
  vanishes costs only its lease), the learner on demand in both runs; volunteers' Macs cost 0.
- **Co-located baseline**: the H200 generates each batch (at the decode rate of its own memory
  bandwidth, same efficiency and batch gain as the consumer GPUs: assumption) and then trains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Published figures and prices used below.
SOURCES = {
    "rtx3090-llamacpp": "calebcoffie.com/benchmarks (llama.cpp CUDA, RTX 3090, Q4_K_M, concurrency 1): "
                        "Gemma-3 4B 188-197 tok/s, Qwen3.6-27B 20.0-21.6 tok/s",
    "batch8": "gigagpu.com RTX 4090 Llama 3.1 70B AWQ-INT4 benchmark: 23 tok/s at batch 1, 110 tok/s at batch 8",
    "prices": "deploybase.ai, RunPod GPU pricing, March 2026: RTX 3090 $0.22/h spot, RTX 4090 $0.34/h spot, "
              "H200 $6.35/h on demand",
    "echo2": "ECHO-2, arXiv 2602.02192: GRPO on Qwen3-4B and 8B (later versions up to 32B), staleness S "
             "stable up to about 6, cumulative cost about a third lower than a centralised baseline",
}
#: (weights' bytes, single-sequence tok/s) on an RTX 3090 (936 GB/s), from :data:`SOURCES`.
CALIBRATION = ((4.0e9 * 0.61, 192.0), (27.0e9 * 0.61, 20.8))
RTX3090_BW = 936e9
#: Q4_K_M bytes per parameter (assumption: about 4.85 bits per weight).
Q4KM_BYTES_PER_PARAM = 0.61
#: Aggregate decode gain of a group of 8 over one sequence on a GPU (110 / 23 = 4.8, rounded down).
BATCH_GAIN = {"gpu": 4.0, "apple": 2.0}


@dataclass(frozen=True)
class Device:
    name: str
    bandwidth: float  # bytes/s
    cost_h: float
    kind: str  # "gpu" | "apple"


DEVICES = (
    Device("RTX 3090 (llama.cpp CUDA)", 936e9, 0.22, "gpu"),
    Device("RTX 4090 (llama.cpp CUDA)", 1008e9, 0.34, "gpu"),
    Device("Apple M3 Max (llama.cpp Metal, volunteer)", 400e9, 0.0, "apple"),
)
LEARNER = Device("H200", 4.8e12, 6.35, "gpu")
PROMPTS, GROUP, COMPLETION = 8, 8, 512
#: Tokens a learner step trains (prompts x group x (256 prompt + completion tokens)).
LEARNER_TOKENS = PROMPTS * GROUP * (256 + COMPLETION)
#: The H200's dense bf16 peak (FLOP/s, NVIDIA's published figure) and the fraction of it a LoRA
#: step is assumed to reach (assumption: not measured on a GPU by this project).
H200_BF16_FLOPS = 989e12
ASSUMED_MFU = 0.3


def assumed_learner_step_s(params: float, tokens: int = LEARNER_TOKENS) -> float:
    """The learner's step time on one H200 by arithmetic (see the module docstring): an
    assumption until ``swarm-bench gpu-check`` has measured it."""
    return 6.0 * params * tokens / (ASSUMED_MFU * H200_BF16_FLOPS)
NODE_DOWN, NODE_UP, LEARNER_UP = 100e6 / 8, 10e6 / 8, 1e9 / 8
TARGETS = ("qwen3-4b", "qwen3-8b", "qwen3-32b")


def shape_params(name: str, rank: int = 8) -> tuple[int, int]:
    """(parameters, LoRA parameters at ``rank`` on the seven projections) of a model shape (pure)."""
    from common.random_model import SHAPES, shape_of

    family, size = shape_of(name)
    s = SHAPES[family][size]
    h, inter, layers, vocab = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"], s["vocab_size"]
    hd = s.get("head_dim") or h // s["num_attention_heads"]
    q, kv = s["num_attention_heads"] * hd, s["num_key_value_heads"] * hd
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * inter
    tied = s.get("tie_word_embeddings", True)
    params = layers * per_layer + vocab * h * (1 if tied else 2)
    lora = layers * rank * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + inter) + (inter + h))
    return params, lora


def single_tok_s(weights_bytes: float, bandwidth: float) -> float:
    """One sequence's decode rate: an effective bandwidth over the weights' bytes, the effective
    bandwidth interpolated (log-log) between the :data:`CALIBRATION` points, scaled by device (pure)."""
    (b1, t1), (b2, t2) = CALIBRATION
    e1, e2 = b1 * t1, b2 * t2  # effective bytes/s on the RTX 3090
    x = min(max(math.log(weights_bytes), math.log(b1)), math.log(b2))
    eff = math.exp(math.log(e1) + (x - math.log(b1)) * (math.log(e2) - math.log(e1)) / (math.log(b2) - math.log(b1)))
    return eff * bandwidth / RTX3090_BW / weights_bytes


def extrapolate(fits: dict, res: dict, staleness=(0, 1, 2, 4, 6), target_util: float = 0.95) -> str:
    """The Markdown table of the extrapolation (see the module docstring)."""
    from bench.capacity.model import Network, WorkerClass, Workload, evaluate
    from bench.capacity.provision import cheapest

    int3 = _int3_bytes_per_param(res)
    head = ["model (params, LoRA r=8)", "MB per version: int3 delta / fp16", "learner step T s", "node kind",
            "tok/s per group", "group L s", "broadcast d s"] + [f"S={S}" for S in staleness] + \
        ["$/step swarm (cheapest S >= 1)", "$/step co-located", "ratio"]
    lines = [f"Learner: one H200, step time ASSUMED (not measured: 6 x params x tokens FLOPs at {ASSUMED_MFU:.0%} of "
             f"its bf16 peak, {PROMPTS} x {GROUP} rollouts of 256 + {COMPLETION} tokens); int3 deltas of {int3:.3f} bytes "
             "per adapter parameter (measured); nodes and prices from the sources below.", "",
             "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name in TARGETS:
        params, lora = shape_params(name)
        train_s = assumed_learner_step_s(params)
        delta, fp16 = lora * int3, lora * 1.82
        net = Network(adapter_bytes=delta, topology="tree", fanout=2, learner_up_Bps=LEARNER_UP)
        h200_rate = single_tok_s(params * 2.0, LEARNER.bandwidth) * BATCH_GAIN["gpu"] * PROMPTS
        colo_cost = (train_s + PROMPTS * GROUP * COMPLETION / h200_rate) * LEARNER.cost_h / 3600
        for dev in DEVICES:
            rate = single_tok_s(params * Q4KM_BYTES_PER_PARAM, dev.bandwidth) * BATCH_GAIN[dev.kind]
            group_s = GROUP * COMPLETION / rate
            bound = min(2000, math.ceil(10 * PROMPTS * group_s / train_s) + 8)  # ten times the raw need
            wc = WorkerClass(dev.name, group_s=group_s, cost_per_h=dev.cost_h, down_Bps=NODE_DOWN, up_Bps=NODE_UP,
                             max_count=bound)
            cells: list[str] = []
            best: tuple[float, int] | None = None
            d: float | None = None
            for S in staleness:
                w = Workload(PROMPTS, GROUP, train_s, staleness=S, mode="async" if S else "sequential",
                             learner_cost_per_h=LEARNER.cost_h)
                if S == 0:  # sequential: a group per node, the learner waits for the batch
                    pred, count = evaluate(w, [wc], [PROMPTS], net), PROMPTS
                else:
                    plan = cheapest(w, [wc], target_util, net)
                    pred, count = (plan.prediction, plan.counts[0]) if plan else (None, None)  # type: ignore[assignment]
                if pred is None:
                    cells.append(f"none (d + L > {S} T)" if d is not None and d + group_s > S * train_s else "none")
                    continue
                d = max(pred.delays_s)
                cells.append(f"{count} nodes, util {pred.utilisation:.2f}")
                if S >= 1 and (best is None or pred.cost_per_step < best[0]):
                    best = (pred.cost_per_step, S)
            row = [f"{name} ({params / 1e9:.1f} B, {lora / 1e6:.1f} M)", f"{delta / 1e6:.1f} / {fp16 / 1e6:.1f}",
                   f"{train_s:.1f}", dev.name, f"{rate:.0f}", f"{group_s:.1f}", "-" if d is None else f"{d:.1f}",
                   *cells, "-" if best is None else f"{best[0]:.4f} (S={best[1]})", f"{colo_cost:.4f}",
                   "-" if best is None else f"{best[0] / colo_cost:.2f}"]
            lines.append("| " + " | ".join(row) + " |")
    lines += ["", "S = 0: sequential (one group per node; the learner waits for the batch). S >= 1: the cheapest "
              "count of that kind alone keeping the learner >= 95% busy (bench/capacity/provision.py), or none "
              "when versions reach the nodes too late (d + L > S T: ECHO-2's freshness condition). broadcast d: "
              "the model's delay of one version to those nodes through the tree. Co-located: the H200 "
              "generating each batch itself, then training.", "",
              "Sources: " + "; ".join(f"{k}: {v}" for k, v in SOURCES.items())]
    return "\n".join(lines)


def _int3_bytes_per_param(res: dict) -> float:
    """The measured int3 delta bytes per adapter parameter at the largest measured size (0.40 if none)."""
    for size in ("1.5b", "0.5b", "135m"):
        r = res.get(("adapter", size))
        if r and "delta_int3" in r.get("bytes_per_param", {}):
            return float(r["bytes_per_param"]["delta_int3"])
    return 0.40
