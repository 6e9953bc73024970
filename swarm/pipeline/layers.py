"""Which decoder layer a parameter name belongs to, and a layer range's slice of an adapter.

peft state-dict names carry the layer as ``...layers.<i>....`` (e.g.
``base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight``); a stage serving
``[start, end)`` takes the tensors of those layers only.
"""

from __future__ import annotations

import re
from typing import Mapping, TypeVar

T = TypeVar("T")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def layer_index(name: str) -> int | None:
    """The decoder layer of parameter ``name``, or None when it belongs to no layer."""
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def slice_for_range(tensors: Mapping[str, T], start: int, end: int) -> dict[str, T]:
    """The entries of ``tensors`` whose layer lies in ``[start, end)``."""
    out = {}
    for name, value in tensors.items():
        i = layer_index(name)
        if i is not None and start <= i < end:
            out[name] = value
    return out


def check_route(ranges: list[tuple[int, int]], n_layers: int) -> None:
    """Raise ``ValueError`` unless ``ranges`` tile ``[0, n_layers)`` in order, each non-empty."""
    if not ranges:
        raise ValueError("empty route")
    at = 0
    for start, end in ranges:
        if start != at or end <= start:
            raise ValueError(f"route {ranges} does not tile [0, {n_layers}) (gap or overlap at layer {at})")
        at = end
    if at != n_layers:
        raise ValueError(f"route {ranges} ends at layer {at}, the model has {n_layers}")
