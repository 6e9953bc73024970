"""Adapter versions as the learner serves them to nodes."""

from __future__ import annotations

from node_agents.backends.base import LoraAdapter
from swarm.proto.adapter import AdapterReply, encode_tensors


def adapter_reply(adapter: LoraAdapter, dtype: str = "float32") -> AdapterReply:
    return AdapterReply(
        version=adapter.version,
        rank=adapter.rank,
        alpha=adapter.alpha,
        target_modules=list(adapter.target_modules),
        tensors=encode_tensors(adapter.tensors, dtype),
    )
