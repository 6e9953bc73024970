"""How many groups a pipeline keeps in flight, and what its links cost: pure functions.

Routing is a star (the head drives every stage in turn), so one decode step of one group
visits every hop: the head sends the step to stage ``i`` and waits for its answer, which takes
the stage's compute ``busy_i`` plus the round trip between head and stage (serialisation and
transfer included). One group's step therefore takes ``cycle = sum(wait_i)`` where
``wait_i = busy_i + rtt_i`` (what the head measures per hop), while each stage is busy only
``busy_i`` of it. With ``G`` groups in flight the stages interleave them step by step, and the
slowest stage is saturated (the pipeline runs at its compute-bound rate, the round trips
hidden) once ``G * max(busy) >= cycle``. :func:`groups_in_flight` picks that ``G`` from what the
head measured, with some headroom for jitter, within the cap the learner planned KV memory for.

:func:`pipeline_rate` is the matching throughput model (groups' steps per second) that the
allocator uses to compare pipelines whose links differ.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: Extra groups over the exact saturation point, for jitter in the round trips and compute.
HEADROOM = 1.25


def groups_in_flight(busy_s: Sequence[float], wait_s: Sequence[float], cap: int, headroom: float = HEADROOM) -> int:
    """Groups to keep in flight: ``ceil(headroom * sum(wait) / max(busy))`` in ``[1, cap]``.

    ``busy_s[i]``: stage ``i``'s compute per step of one group (seconds, as the stage reports
    it); ``wait_s[i]``: the head's wait for that hop per step (compute plus round trip). Both are
    per-step averages over what the head measured. With no measurement yet (all zero):
    ``min(cap, 2)``."""
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    if len(busy_s) != len(wait_s) or not busy_s:
        raise ValueError("one busy and one wait figure per hop")
    if min(min(busy_s), min(wait_s)) < 0 or not all(math.isfinite(x) for x in (*busy_s, *wait_s)):
        raise ValueError("busy and wait must be finite and >= 0")
    slowest = max(busy_s)
    cycle = sum(max(w, b) for w, b in zip(wait_s, busy_s))
    if slowest <= 0 or cycle <= 0:
        return min(cap, 2)
    return max(1, min(cap, math.ceil(headroom * cycle / slowest)))


def pipeline_rate(busy_s: Sequence[float], rtt_s: Sequence[float], in_flight: int) -> float:
    """Group steps per second of a pipeline with ``in_flight`` groups: the smaller of the
    latency-bound rate ``in_flight / cycle`` and the compute-bound rate ``1 / max(busy)``, with
    ``cycle = sum(busy_i + rtt_i)`` (``rtt_i``: head <-> stage ``i``, 0 for the head's own)."""
    if len(busy_s) != len(rtt_s) or not busy_s or in_flight < 1:
        raise ValueError("one busy and one rtt figure per hop, and in_flight >= 1")
    cycle = sum(b + r for b, r in zip(busy_s, rtt_s))
    slowest = max(busy_s)
    if cycle <= 0 or slowest <= 0:
        return math.inf
    return min(in_flight / cycle, 1.0 / slowest)


def in_flight_cap(stages: Sequence[tuple[int, int]], n_layers: int, memory_bytes: Sequence[float],
                  layer_bytes: int, kv_bytes_per_group_layer: int, end_bytes: tuple[int, int],
                  planned: int, most: int) -> int:
    """Most groups a pipeline may keep in flight: what the stage with the least spare memory
    holds in KV caches beyond its weights (``memory_bytes[i]``: what stage ``i`` may use), never
    below the ``planned`` depth the allocator already budgeted for, never above ``most``.

    ``stages``: each stage's ``(start, end)`` layers; ``end_bytes``: the embedding's and the
    head's bytes (on the first and the last stage); ``kv_bytes_per_group_layer``: one group's KV
    cache for one layer at the longest sequence."""
    if kv_bytes_per_group_layer <= 0 or not stages:
        return max(planned, 1)
    fits = []
    for i, ((start, end), mem) in enumerate(zip(stages, memory_bytes)):
        weights = (end - start) * layer_bytes + (end_bytes[0] if start == 0 else 0) + \
            (end_bytes[1] if end == n_layers else 0)
        fits.append(int(max(0.0, mem - weights) // (kv_bytes_per_group_layer * max(1, end - start))))
    return max(1, planned, min(most, min(fits)))
