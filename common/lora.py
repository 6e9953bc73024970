"""A LoRA adapter as both roles hold it: the learner exports and publishes it, the nodes
decode and install it. Its wire form is ``swarm.proto.adapter.AdapterReply``
(``AdapterReply.from_adapter`` / ``AdapterReply.to_adapter``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class LoraAdapter:
    """A LoRA adapter as the learner publishes it, backend-neutral.

    ``tensors`` maps peft state-dict names, e.g.
    ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` (shape ``[r, in]``) and
    ``...lora_B.weight`` (shape ``[out, r]``), to float32 arrays. The effective weight update of
    a module is ``(alpha / rank) * B @ A``.
    """

    version: int
    rank: int
    alpha: float
    target_modules: list[str]
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
