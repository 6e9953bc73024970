"""When a version goes out as a delta: the dissemination's rule (pure).

A delta (``swarm.dissem.codec``: the difference to the previous version as every node decoded
it) is smaller only when versions move little, and it binds a node to the version before: a node
that missed that one decodes the chain back from a version it holds (``node_agents.adapter_sync``)
or, failing that, fetches the version whole from the learner. Its error is bounded by its codec
on the *change* (int3, the default ``dissem.delta_codec``: a sixth of the largest change in each
block of 64 values; int4: a fourteenth), so it is small against one optimizer step, never against
the weights themselves; a version that jumps (a restart from another adapter, a reset) must go
out whole. So the learner encodes every version both ways and, per version:

- ``mode = true``: a delta whenever there is a base (the previous version was published);
- ``mode = false``: never;
- ``mode = "auto"`` (the default): a delta when its compressed bytes are at most
  :data:`MAX_DELTA_RATIO` of the whole version's and the adapter moved less than
  :data:`MAX_MOVE` of its norm since the base (:func:`relative_change`). Measured with the
  learner's defaults (``swarm-bench adapter-bytes``, ``docs/benchmarks.md``), int3 deltas take
  about a fifth of a whole fp16 version (int4 0.28-0.30) from 135M to 4B parameters, and a
  step moves the adapter by 2-5% of its norm: ``auto`` sends deltas.
"""

from __future__ import annotations

import math
from typing import Callable, Literal, Mapping

import numpy as np

from swarm.dissem.codec import CodecConfig
from swarm.proto.dissem import Manifest

#: ``dissem.delta``: ``"auto"`` (a delta where it pays, measured per version), ``True``, ``False``.
DeltaMode = Literal["auto", True, False]
#: ``auto``: the largest delta size, as a fraction of the whole version, still sent as a delta.
MAX_DELTA_RATIO = 0.5
#: ``auto``: the largest change since the base, as a fraction of the adapter's norm, still sent
#: as a delta (a training step moves it by about 1%; an unrelated adapter by about 140%).
MAX_MOVE = 0.25


def relative_change(tensors: Mapping[str, np.ndarray], base: Mapping[str, np.ndarray]) -> float:
    """``||tensors - base|| / ||tensors||`` over all tensors (Frobenius); inf when a tensor has
    no base of its shape, 0 for an all-zero adapter that did not move."""
    diff = norm = 0.0
    for name, x in tensors.items():
        b = base.get(name)
        if b is None or b.shape != x.shape:
            return math.inf
        x64 = np.asarray(x, np.float64)
        diff += float(np.sum((x64 - np.asarray(b, np.float64)) ** 2))
        norm += float(np.sum(x64 ** 2))
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return math.sqrt(diff / norm)


def choose(has_base: bool, delta_bytes: int, full_bytes: int, mode: DeltaMode = "auto", moved: float = 0.0,
           max_ratio: float = MAX_DELTA_RATIO, max_move: float = MAX_MOVE) -> bool:
    """Whether this version goes out as the delta (True) or whole (False); ``moved``: its
    :func:`relative_change` since the base."""
    if not has_base or not mode:
        return False
    if mode == "auto":
        return delta_bytes <= max_ratio * full_bytes and moved <= max_move
    return True


def encode_best(build: Callable[[CodecConfig, tuple[int, dict] | None], tuple[Manifest, list[bytes]]],
                codec: CodecConfig, delta_codec: CodecConfig, base: tuple[int, dict] | None,
                mode: DeltaMode = "auto", tensors: Mapping[str, np.ndarray] | None = None) -> tuple[Manifest, list[bytes]]:
    """A version whole (``codec``), or as the delta to ``base`` (``(version, decoded tensors)``,
    in ``delta_codec``) where :func:`choose` says so; ``build(codec, base)`` encodes it
    (``swarm.dissem.manifest.build_version`` with the version's fields); ``tensors``: the
    version's exact tensors (for how far it moved)."""
    whole = build(codec, None)
    if base is None or not mode:
        return whole
    moved = relative_change(tensors, base[1]) if tensors is not None and mode == "auto" else 0.0
    if mode == "auto" and moved > MAX_MOVE:
        return whole  # a jump: not even worth encoding the delta
    delta = build(delta_codec, base)
    return delta if choose(True, delta[0].total_bytes, whole[0].total_bytes, mode, moved) else whole
